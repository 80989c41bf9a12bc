package sotercare

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/sotercare/jetbridge/subjects"
)

// Reading is one sensor reading as a device sends it.
type Reading struct {
	EventID   string  `json:"eventId"`
	DeviceID  string  `json:"deviceId"`
	EventType string  `json:"eventType"` // fall | vitals | moisture
	Value     float64 `json:"value"`
	Unit      string  `json:"unit"`      // boolean | bpm | percent
	Timestamp int64   `json:"timestamp"` // when the device took it, > 0 (epoch milliseconds)
}

// Event types and their units.
const (
	TypeFall     = "fall"
	TypeVitals   = "vitals"
	TypeMoisture = "moisture"

	UnitBoolean = "boolean"
	UnitBPM     = "bpm"
	UnitPercent = "percent"
)

// Severity is SoterCare's care severity.
type Severity string

// The care severities, from least to most urgent.
const (
	Normal   Severity = "normal"
	Medium   Severity = "medium"
	High     Severity = "high"
	Critical Severity = "critical"
)

// Bridge maps a care severity to the bridge severity: normal INFO, medium
// and high WARNING, critical CRITICAL.
func (s Severity) Bridge() subjects.Severity {
	switch s {
	case Critical:
		return subjects.Critical
	case High, Medium:
		return subjects.Warning
	}
	return subjects.Info
}

// Route is where SoterCare sends a reading.
type Route string

// The care routes. They are subject tokens.
const (
	Caregiver Route = "caregiver" // a caregiver is notified
	EventLog  Route = "eventlog"  // recorded only
)

// Classification is SoterCare's decision about a valid reading.
type Classification struct {
	Severity Severity
	Route    Route
}

// Thresholds (synthetic, not clinical).
const (
	MinIDLen       = 4   // eventId, characters
	MinDeviceIDLen = 3   // deviceId, characters
	MaxIDLen       = 128 // eventId and deviceId, bytes of UTF-8
	MinBPM         = 30  // vitals outside [MinBPM, MaxBPM] are invalid
	MaxBPM         = 240 //
	LowBPM         = 50  // below: high, caregiver
	HighBPM        = 120 // above: high, caregiver
	WetPercent     = 80  // moisture at or above: medium, event log
)

// ErrInvalidReading is matched (errors.Is) by every validation error.
var ErrInvalidReading = errors.New("invalid reading")

// InvalidError says which field of a reading is invalid and why. Its
// message names the field and the rule, never the whole reading.
type InvalidError struct {
	Field  string // JSON name, e.g. "value"
	Reason string
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Reason }

// Is makes every InvalidError match ErrInvalidReading.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalidReading }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Classify validates r and decides its care severity and route:
//
//   - eventId at least 4 characters, deviceId at least 3, both valid
//     UTF-8 of at most 128 bytes, neither with whitespace or control
//     characters; timestamp positive;
//   - deviceId usable as one subject token (no '.', '*' or '>'): it is
//     the token the caregiver route orders by;
//   - fall: unit boolean, value 0 or 1. 1 ("fall detected") is critical,
//     0 ("fall resolved") normal, both for the caregiver: the caregiver
//     must see a resolution after its fall;
//   - vitals: unit bpm, value 30..240. Below 50 or above 120 is high
//     (caregiver), else normal (event log);
//   - moisture: unit percent, value 0..100. 80 or more is medium (event
//     log), else normal (event log);
//   - any other event type is invalid.
//
// The error is an *InvalidError (errors.Is ErrInvalidReading).
func Classify(r Reading) (Classification, error) {
	return classify(r, MaxIDLen)
}

// classify is Classify with ids of at most maxIDLen bytes.
func classify(r Reading, maxIDLen int) (Classification, error) {
	if err := checkID("eventId", r.EventID, MinIDLen, maxIDLen); err != nil {
		return Classification{}, err
	}
	if err := checkID("deviceId", r.DeviceID, MinDeviceIDLen, maxIDLen); err != nil {
		return Classification{}, err
	}
	if strings.ContainsAny(r.DeviceID, ".*>") {
		return Classification{}, invalid("deviceId", "must not contain '.', '*' or '>' (it is a subject token)")
	}
	if r.Timestamp <= 0 {
		return Classification{}, invalid("timestamp", "must be positive")
	}
	switch r.EventType {
	case TypeFall:
		if err := checkUnit(r, UnitBoolean); err != nil {
			return Classification{}, err
		}
		switch r.Value {
		case 1:
			return Classification{Critical, Caregiver}, nil
		case 0:
			return Classification{Normal, Caregiver}, nil
		}
		return Classification{}, invalid("value", "a fall is 0 or 1")
	case TypeVitals:
		if err := checkUnit(r, UnitBPM); err != nil {
			return Classification{}, err
		}
		if r.Value < MinBPM || r.Value > MaxBPM {
			return Classification{}, invalid("value", "vitals must be %d to %d bpm", MinBPM, MaxBPM)
		}
		if r.Value < LowBPM || r.Value > HighBPM {
			return Classification{High, Caregiver}, nil
		}
		return Classification{Normal, EventLog}, nil
	case TypeMoisture:
		if err := checkUnit(r, UnitPercent); err != nil {
			return Classification{}, err
		}
		if r.Value < 0 || r.Value > 100 {
			return Classification{}, invalid("value", "moisture must be 0 to 100 percent")
		}
		if r.Value >= WetPercent {
			return Classification{Medium, EventLog}, nil
		}
		return Classification{Normal, EventLog}, nil
	case "":
		return Classification{}, invalid("eventType", "is required")
	}
	return Classification{}, invalid("eventType", "unsupported; use fall, vitals or moisture")
}

func checkID(field, id string, minLen, maxLen int) error {
	if n := utf8.RuneCountInString(id); n < minLen {
		return invalid(field, "must be at least %d characters", minLen)
	}
	if !utf8.ValidString(id) {
		return invalid(field, "must be valid UTF-8")
	}
	if len(id) > maxLen {
		return invalid(field, "must be at most %d bytes", maxLen)
	}
	for _, c := range id {
		if unicode.IsSpace(c) || unicode.IsControl(c) {
			return invalid(field, "must not contain whitespace or control characters")
		}
	}
	return nil
}

func checkUnit(r Reading, want string) error {
	if r.Unit != want {
		return invalid("unit", "%s readings are in %s", r.EventType, want)
	}
	return nil
}

// EventType is the bridge event type of a classified reading,
// "care.<route>.<eventType>" (the Event-Type header).
func (c Classification) EventType(r Reading) string {
	return "care." + string(c.Route) + "." + r.EventType
}

// Subject is the subject a classified reading is published on under root:
// <root>.<severity>.care.<route>.<deviceId>.<eventType>. The device is the
// fifth token, whatever the severity, so a route can order one device's
// alerts (ordering key tokens [5], config/sotercare.yaml).
func (c Classification) Subject(root string, r Reading) (string, error) {
	return subjects.Name(root, c.Severity.Bridge(), "care."+string(c.Route)+"."+r.DeviceID+"."+r.EventType)
}
