package sotercare

import (
	"errors"
	"testing"

	"github.com/sotercare/jetbridge/subjects"
)

// reading returns a valid reading of the given type, value and unit.
func reading(typ string, value float64, unit string) Reading {
	return Reading{EventID: "evt-0001", DeviceID: "bed-3", EventType: typ, Value: value, Unit: unit, Timestamp: 1735689600000}
}

// Every rule and boundary of the prototype, with the subject each valid
// reading is published on.
func TestClassify(t *testing.T) {
	with := func(r Reading, f func(*Reading)) Reading { f(&r); return r }
	fall := reading(TypeFall, 1, UnitBoolean)
	tests := []struct {
		name        string
		r           Reading
		want        Classification
		wantSubject string
		wantField   string // "" for valid readings
	}{
		// fall
		{"fall 1 is critical for the caregiver", fall, Classification{Critical, Caregiver}, "events.critical.care.caregiver.bed-3.fall", ""},
		{"fall 0 (resolved) is normal for the caregiver", reading(TypeFall, 0, UnitBoolean), Classification{Normal, Caregiver}, "events.info.care.caregiver.bed-3.fall", ""},
		{"fall 0.5", reading(TypeFall, 0.5, UnitBoolean), Classification{}, "", "value"},
		{"fall 2", reading(TypeFall, 2, UnitBoolean), Classification{}, "", "value"},
		{"fall -1", reading(TypeFall, -1, UnitBoolean), Classification{}, "", "value"},
		{"fall in bpm", reading(TypeFall, 1, UnitBPM), Classification{}, "", "unit"},
		{"fall without unit", reading(TypeFall, 1, ""), Classification{}, "", "unit"},
		// vitals
		{"vitals 29.9 bpm", reading(TypeVitals, 29.9, UnitBPM), Classification{}, "", "value"},
		{"vitals 30 bpm is high", reading(TypeVitals, 30, UnitBPM), Classification{High, Caregiver}, "events.warning.care.caregiver.bed-3.vitals", ""},
		{"vitals 49.9 bpm is high", reading(TypeVitals, 49.9, UnitBPM), Classification{High, Caregiver}, "events.warning.care.caregiver.bed-3.vitals", ""},
		{"vitals 50 bpm is normal", reading(TypeVitals, 50, UnitBPM), Classification{Normal, EventLog}, "events.info.care.eventlog.bed-3.vitals", ""},
		{"vitals 72 bpm is normal", reading(TypeVitals, 72, UnitBPM), Classification{Normal, EventLog}, "events.info.care.eventlog.bed-3.vitals", ""},
		{"vitals 120 bpm is normal", reading(TypeVitals, 120, UnitBPM), Classification{Normal, EventLog}, "events.info.care.eventlog.bed-3.vitals", ""},
		{"vitals 120.1 bpm is high", reading(TypeVitals, 120.1, UnitBPM), Classification{High, Caregiver}, "events.warning.care.caregiver.bed-3.vitals", ""},
		{"vitals 240 bpm is high", reading(TypeVitals, 240, UnitBPM), Classification{High, Caregiver}, "events.warning.care.caregiver.bed-3.vitals", ""},
		{"vitals 240.1 bpm", reading(TypeVitals, 240.1, UnitBPM), Classification{}, "", "value"},
		{"vitals in percent", reading(TypeVitals, 72, UnitPercent), Classification{}, "", "unit"},
		{"vitals in BPM (case matters)", reading(TypeVitals, 72, "BPM"), Classification{}, "", "unit"},
		// moisture
		{"moisture -0.1 percent", reading(TypeMoisture, -0.1, UnitPercent), Classification{}, "", "value"},
		{"moisture 0 percent is normal", reading(TypeMoisture, 0, UnitPercent), Classification{Normal, EventLog}, "events.info.care.eventlog.bed-3.moisture", ""},
		{"moisture 79.9 percent is normal", reading(TypeMoisture, 79.9, UnitPercent), Classification{Normal, EventLog}, "events.info.care.eventlog.bed-3.moisture", ""},
		{"moisture 80 percent is medium", reading(TypeMoisture, 80, UnitPercent), Classification{Medium, EventLog}, "events.warning.care.eventlog.bed-3.moisture", ""},
		{"moisture 100 percent is medium", reading(TypeMoisture, 100, UnitPercent), Classification{Medium, EventLog}, "events.warning.care.eventlog.bed-3.moisture", ""},
		{"moisture 100.1 percent", reading(TypeMoisture, 100.1, UnitPercent), Classification{}, "", "value"},
		{"moisture in boolean", reading(TypeMoisture, 1, UnitBoolean), Classification{}, "", "unit"},
		// event type
		{"temperature is unsupported", reading("temperature", 37, "celsius"), Classification{}, "", "eventType"},
		{"Fall (case matters)", reading("Fall", 1, UnitBoolean), Classification{}, "", "eventType"},
		{"no event type", reading("", 1, UnitBoolean), Classification{}, "", "eventType"},
		// ids and timestamp
		{"eventId of 3 characters", with(fall, func(r *Reading) { r.EventID = "e-1" }), Classification{}, "", "eventId"},
		{"eventId of 4 characters", with(fall, func(r *Reading) { r.EventID = "e-12" }), Classification{Critical, Caregiver}, "events.critical.care.caregiver.bed-3.fall", ""},
		{"eventId of 4 runes, 8 bytes", with(fall, func(r *Reading) { r.EventID = "éééé" }), Classification{Critical, Caregiver}, "events.critical.care.caregiver.bed-3.fall", ""},
		{"empty eventId", with(fall, func(r *Reading) { r.EventID = "" }), Classification{}, "", "eventId"},
		{"eventId with a space", with(fall, func(r *Reading) { r.EventID = "evt 0001" }), Classification{}, "", "eventId"},
		{"eventId with a line break", with(fall, func(r *Reading) { r.EventID = "evt\r\n0001" }), Classification{}, "", "eventId"},
		{"deviceId of 2 characters", with(fall, func(r *Reading) { r.DeviceID = "b3" }), Classification{}, "", "deviceId"},
		{"deviceId of 3 characters", with(fall, func(r *Reading) { r.DeviceID = "b-3" }), Classification{Critical, Caregiver}, "events.critical.care.caregiver.b-3.fall", ""},
		{"deviceId with a tab", with(fall, func(r *Reading) { r.DeviceID = "bed\t3" }), Classification{}, "", "deviceId"},
		{"deviceId with a dot", with(fall, func(r *Reading) { r.DeviceID = "bed.3" }), Classification{}, "", "deviceId"},
		{"deviceId with a wildcard", with(fall, func(r *Reading) { r.DeviceID = "bed*" }), Classification{}, "", "deviceId"},
		{"deviceId with a tail wildcard", with(fall, func(r *Reading) { r.DeviceID = "bed>" }), Classification{}, "", "deviceId"},
		{"timestamp 0", with(fall, func(r *Reading) { r.Timestamp = 0 }), Classification{}, "", "timestamp"},
		{"timestamp -1", with(fall, func(r *Reading) { r.Timestamp = -1 }), Classification{}, "", "timestamp"},
		{"timestamp 1", with(fall, func(r *Reading) { r.Timestamp = 1 }), Classification{Critical, Caregiver}, "events.critical.care.caregiver.bed-3.fall", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Classify(tt.r)
			if tt.wantField != "" {
				var ie *InvalidError
				if !errors.As(err, &ie) || ie.Field != tt.wantField || !errors.Is(err, ErrInvalidReading) {
					t.Fatalf("Classify = %+v, %v; want an *InvalidError on %s matching ErrInvalidReading", got, err, tt.wantField)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Classify = %+v, %v; want %+v", got, err, tt.want)
			}
			subject, err := got.Subject("events", tt.r)
			if err != nil || subject != tt.wantSubject {
				t.Fatalf("Subject = %q, %v; want %q", subject, err, tt.wantSubject)
			}
		})
	}
}

// Care severity maps to the bridge severity; the route is not part of the
// mapping, so medium and high share WARNING but keep their own routes.
func TestSeverityMapping(t *testing.T) {
	tests := []struct {
		care Severity
		want subjects.Severity
	}{
		{Normal, subjects.Info},
		{Medium, subjects.Warning},
		{High, subjects.Warning},
		{Critical, subjects.Critical},
	}
	for _, tt := range tests {
		if got := tt.care.Bridge(); got != tt.want {
			t.Errorf("%s.Bridge() = %s, want %s", tt.care, got, tt.want)
		}
	}
	high, _ := Classify(reading(TypeVitals, 130, UnitBPM))
	wet, _ := Classify(reading(TypeMoisture, 90, UnitPercent))
	if high.Severity.Bridge() != wet.Severity.Bridge() || high.Route == wet.Route {
		t.Fatalf("high vitals %+v and wet moisture %+v: want the same bridge severity and different routes", high, wet)
	}
	hs, _ := high.Subject("events", reading(TypeVitals, 130, UnitBPM))
	ws, _ := wet.Subject("events", reading(TypeMoisture, 90, UnitPercent))
	if !subjects.Match("events.warning.care.caregiver.>", hs) || subjects.Match("events.warning.care.caregiver.>", ws) {
		t.Fatalf("subjects %s and %s: only the first may match the caregiver filter", hs, ws)
	}
}

// The published event carries the eventId, the scheme's type and severity,
// and the decision in its payload and metadata.
func TestEvent(t *testing.T) {
	r := reading(TypeVitals, 130, UnitBPM)
	c, err := Classify(r)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := Event("events", r, c, "corr-1")
	if err != nil {
		t.Fatal(err)
	}
	if ev.ID != "evt-0001" || ev.Type != "care.caregiver.vitals" || ev.Severity != subjects.Warning {
		t.Fatalf("event id=%q type=%q severity=%q", ev.ID, ev.Type, ev.Severity)
	}
	want := `{"eventId":"evt-0001","deviceId":"bed-3","eventType":"vitals","value":130,"unit":"bpm","timestamp":1735689600000,"careSeverity":"high","routedTo":"caregiver","correlationId":"corr-1"}`
	if string(ev.Payload) != want {
		t.Fatalf("payload\n%s\nwant\n%s", ev.Payload, want)
	}
	if ev.Metadata["deviceId"] != "bed-3" || ev.Metadata["careSeverity"] != "high" || ev.Metadata["correlationId"] != "corr-1" {
		t.Fatalf("metadata %v", ev.Metadata)
	}
}
