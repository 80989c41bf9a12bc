package sotercare

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/tracing"
)

// Error codes of the API.
const (
	CodeInvalidEvent      = "INVALID_EVENT"      // 400
	CodeDuplicateEvent    = "DUPLICATE_EVENT"    // 409
	CodeBrokerUnavailable = "BROKER_UNAVAILABLE" // 503
)

// correlationHeader carries the correlation id: taken from the request
// when it holds a usable one (1 to 128 visible ASCII characters), else a
// new unique id; always echoed in the response.
const correlationHeader = "X-Correlation-Id"

// DefaultPublishTimeout bounds the wait for JetStream's acknowledgement.
const DefaultPublishTimeout = 5 * time.Second

// maxBody bounds a request body; a reading is a few hundred bytes.
const maxBody = 64 << 10

// Options are the optional parts of a Handler.
type Options struct {
	// Logger gets one line per request (identifiers only, never the
	// body); the zero value logs nothing.
	Logger zerolog.Logger
	// PublishTimeout defaults to DefaultPublishTimeout.
	PublishTimeout time.Duration
}

// APIError is the body of every error response.
type APIError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

// NewHandler returns the SoterCare API publishing with p:
//
//	POST /api/v1/events  a Reading: 202 Receipt; 400 INVALID_EVENT (invalid
//	                     or malformed); 409 DUPLICATE_EVENT; 503
//	                     BROKER_UNAVAILABLE (not stored: retry with the
//	                     same eventId)
//	GET  /api/v1/health  200 {"status":"UP"}
func NewHandler(p *producer.Publisher, opts Options) http.Handler {
	if opts.PublishTimeout <= 0 {
		opts.PublishTimeout = DefaultPublishTimeout
	}
	a := &api{p: p, opts: opts}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/events", a.postEvent)
	mux.HandleFunc("GET /api/v1/health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "UP"})
	})
	return mux
}

type api struct {
	p    *producer.Publisher
	opts Options
}

func (a *api) postEvent(w http.ResponseWriter, r *http.Request) {
	cid := r.Header.Get(correlationHeader)
	if !usableCorrelationID(cid) {
		cid = nuid.Next()
	}
	w.Header().Set(correlationHeader, cid)
	log := a.opts.Logger.With().Str("correlation_id", cid).Logger()

	reading, err := decodeReading(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		log.Info().Int("status", http.StatusBadRequest).Str("error", err.Error()).Msg("event refused")
		writeJSON(w, http.StatusBadRequest, APIError{Code: CodeInvalidEvent, Message: err.Error()})
		return
	}
	log = log.With().Str("event_id", reading.EventID).Logger()
	// The caller's traceparent, if valid, is the published event's parent.
	ctx, cancel := context.WithTimeout(tracing.ExtractHTTP(r.Context(), r.Header), a.opts.PublishTimeout)
	defer cancel()
	rc, err := Submit(ctx, a.p, reading, cid)
	switch {
	case err == nil:
		log.Info().Int("status", http.StatusAccepted).Str("severity", string(rc.Severity)).
			Str("routed_to", string(rc.RoutedTo)).Uint64("seq", rc.Seq).Msg("event accepted")
		writeJSON(w, http.StatusAccepted, rc)
	case errors.Is(err, ErrInvalidReading):
		log.Info().Int("status", http.StatusBadRequest).Str("error", err.Error()).Msg("event refused")
		writeJSON(w, http.StatusBadRequest, APIError{Code: CodeInvalidEvent, Message: err.Error()})
	case errors.Is(err, ErrDuplicate):
		log.Info().Int("status", http.StatusConflict).Uint64("seq", rc.Seq).Msg("duplicate event refused")
		writeJSON(w, http.StatusConflict, APIError{Code: CodeDuplicateEvent})
	default:
		log.Warn().Int("status", http.StatusServiceUnavailable).Str("error", err.Error()).Msg("event not stored")
		writeJSON(w, http.StatusServiceUnavailable, APIError{Code: CodeBrokerUnavailable})
	}
}

// wireReading is a Reading as decoded, so that a missing field is told
// apart from a zero one. The ids are kept raw: encoding/json replaces
// invalid UTF-8 (and lone surrogate escapes such as "\udc80") with U+FFFD,
// so two different ids could decode to the same key. rawID checks them
// before they are decoded.
type wireReading struct {
	EventID   *json.RawMessage `json:"eventId"`
	DeviceID  *json.RawMessage `json:"deviceId"`
	EventType *string          `json:"eventType"`
	Value     *float64         `json:"value"`
	Unit      *string          `json:"unit"`
	Timestamp *int64           `json:"timestamp"`
}

// decodeReading reads one JSON object. Its errors are *InvalidError and
// never quote the body.
func decodeReading(body io.Reader) (Reading, error) {
	data, err := io.ReadAll(body)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return Reading{}, invalid("body", "larger than %d bytes", tooBig.Limit)
		}
		return Reading{}, invalid("body", "cannot be read")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var w wireReading
	if err := dec.Decode(&w); err != nil {
		return Reading{}, malformed(err)
	}
	if dec.More() {
		return Reading{}, invalid("body", "malformed JSON: more than one value")
	}
	for _, f := range []struct {
		name    string
		present bool
	}{
		{"eventId", w.EventID != nil}, {"deviceId", w.DeviceID != nil}, {"eventType", w.EventType != nil},
		{"value", w.Value != nil}, {"unit", w.Unit != nil}, {"timestamp", w.Timestamp != nil},
	} {
		if !f.present {
			return Reading{}, invalid(f.name, "is required")
		}
	}
	eventID, err := rawID("eventId", *w.EventID)
	if err != nil {
		return Reading{}, err
	}
	deviceID, err := rawID("deviceId", *w.DeviceID)
	if err != nil {
		return Reading{}, err
	}
	return Reading{
		EventID: eventID, DeviceID: deviceID, EventType: *w.EventType,
		Value: *w.Value, Unit: *w.Unit, Timestamp: *w.Timestamp,
	}, nil
}

// rawID decodes the JSON string raw of an id field, refusing what
// encoding/json would silently rewrite: invalid UTF-8 bytes, and \u
// escapes of lone surrogates.
func rawID(field string, raw json.RawMessage) (string, error) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", invalid(field, "must be a string")
	}
	if !utf8.Valid(raw) || hasLoneSurrogate(raw) {
		return "", invalid(field, "must be valid UTF-8")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", invalid(field, "must be a string")
	}
	return s, nil // its length is checked by Classify
}

// hasLoneSurrogate reports whether the JSON string raw (quotes included,
// already scanned as valid JSON) has a \u escape of a UTF-16 surrogate
// that is not part of a high-low pair.
func hasLoneSurrogate(raw []byte) bool {
	for i := 1; i < len(raw)-1; i++ {
		if raw[i] != '\\' {
			continue
		}
		i++ // the escaped character
		if raw[i] != 'u' {
			continue
		}
		r, ok := hex4(raw[i+1:])
		if !ok {
			return true // cannot happen after a successful decode
		}
		i += 4
		switch {
		case r >= 0xDC00 && r <= 0xDFFF:
			return true // a low surrogate with no high one before it
		case r >= 0xD800 && r <= 0xDBFF:
			if i+6 >= len(raw) || raw[i+1] != '\\' || raw[i+2] != 'u' {
				return true
			}
			lo, ok := hex4(raw[i+3:])
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return true
			}
			i += 6
		}
	}
	return false
}

// hex4 reads four hex digits.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// malformed describes a JSON decoding error without quoting the input.
func malformed(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &typ) && typ.Field != "":
		return invalid(typ.Field, "must be %s", jsonKind(typ.Type.Kind()))
	case errors.As(err, &typ):
		return invalid("body", "malformed JSON: want an object")
	case errors.As(err, &syn):
		return invalid("body", "malformed JSON at byte %d", syn.Offset)
	case errors.Is(err, io.EOF):
		return invalid("body", "is empty")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalid("body", "malformed JSON: unexpected end")
	}
	return invalid("body", "malformed JSON")
}

func jsonKind(k reflect.Kind) string {
	switch k {
	case reflect.String:
		return "a string"
	case reflect.Int64:
		return "an integer"
	case reflect.Float64:
		return "a number"
	}
	return "of another JSON type"
}

func usableCorrelationID(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
