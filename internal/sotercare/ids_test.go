package sotercare

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// naiveDecode is decodeReading as it was, in front of the handler: ids
// decoded as plain strings, so encoding/json replaces invalid UTF-8 and
// lone surrogate escapes with U+FFFD before any check sees them. The
// reading goes on re-encoded as so decoded; a body it cannot decode goes on
// as it came.
func naiveDecode(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var reading Reading
		if json.Unmarshal(body, &reading) == nil {
			if body, err = json.Marshal(reading); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		h.ServeHTTP(w, r)
	})
}

// readingWithIDs is a valid fall reading with the given raw JSON ids.
func readingWithIDs(eventID, deviceID string) string {
	return `{"eventId":` + eventID + `,"deviceId":` + deviceID + `,"eventType":"fall","value":1,"unit":"boolean","timestamp":1}`
}

// checkIDs posts readings with hostile and boundary ids and checks each
// answer: 400 naming the field, or 202 with the id stored exactly as sent.
func checkIDs(t *testing.T, e *apiEnv) error {
	long := func(n int) string { return `"` + strings.Repeat("i", n) + `"` }
	tests := []struct {
		name, body string
		message    string // "" when accepted
		storedID   string // accepted: the Nats-Msg-Id stored
	}{
		{"invalid UTF-8 byte", readingWithIDs("\"fall-\xff01\"", `"bed-3"`), "eventId: must be valid UTF-8", ""},
		{"another invalid byte", readingWithIDs("\"fall-\xfe01\"", `"bed-3"`), "eventId: must be valid UTF-8", ""},
		{"lone low surrogate escape", readingWithIDs(`"fall-\udc80"`, `"bed-3"`), "eventId: must be valid UTF-8", ""},
		{"lone high surrogate escape", readingWithIDs(`"fall-\ud800x"`, `"bed-3"`), "eventId: must be valid UTF-8", ""},
		{"high surrogate escape at the end", readingWithIDs(`"fall-\uD800"`, `"bed-3"`), "eventId: must be valid UTF-8", ""},
		{"swapped surrogate escapes", readingWithIDs(`"fall-\ude00\ud83d"`, `"bed-3"`), "eventId: must be valid UTF-8", ""},
		{"invalid UTF-8 deviceId", readingWithIDs(`"fall-0100"`, "\"bed-\xff\""), "deviceId: must be valid UTF-8", ""},
		{"129-byte eventId", readingWithIDs(long(129), `"bed-3"`), "eventId: must be at most 128 bytes", ""},
		{"129-byte deviceId", readingWithIDs(`"fall-0101"`, long(129)), "deviceId: must be at most 128 bytes", ""},
		{"eventId not a string", readingWithIDs(`42`, `"bed-3"`), "eventId: must be a string", ""},
		{"eventId null", readingWithIDs(`null`, `"bed-3"`), "eventId: is required", ""},
		{"128-byte eventId", readingWithIDs(long(128), `"bed-3"`), "", strings.Repeat("i", 128)},
		{"escaped U+FFFD itself", readingWithIDs(`"fall-\ufffd"`, `"bed-3"`), "", "fall-\ufffd"},
		{"surrogate pair escape", readingWithIDs(`"fall-\ud83d\ude00"`, `"bed-3"`), "", "fall-😀"},
	}
	seq := uint64(0)
	for _, tt := range tests {
		r := e.do(t, http.MethodPost, "/api/v1/events", tt.body, nil)
		if tt.message == "" {
			var rc Receipt
			if err := json.Unmarshal([]byte(r.body), &rc); err != nil || r.status != http.StatusAccepted {
				return fmt.Errorf("%s: %d %q, want 202", tt.name, r.status, r.body)
			}
			seq++
			stream, err := e.js.Stream(t.Context(), "EVENTS")
			if err != nil {
				return err
			}
			msg, err := stream.GetMsg(t.Context(), rc.Seq)
			if err != nil {
				return err
			}
			if rc.Seq != seq || msg.Header.Get("Nats-Msg-Id") != tt.storedID || rc.EventID != tt.storedID {
				return fmt.Errorf("%s: stored seq %d (want %d) with id %q, receipt %q; want %q", tt.name, rc.Seq, seq,
					msg.Header.Get("Nats-Msg-Id"), rc.EventID, tt.storedID)
			}
			continue
		}
		var got APIError
		if err := json.Unmarshal([]byte(r.body), &got); err != nil || r.status != http.StatusBadRequest ||
			got.Code != CodeInvalidEvent || got.Message != tt.message {
			return fmt.Errorf("%s: %d %q, want 400 %s %q", tt.name, r.status, r.body, CodeInvalidEvent, tt.message)
		}
	}
	return nil
}

// Ids are checked on the raw bytes: invalid UTF-8 and lone surrogate
// escapes (which encoding/json would turn into U+FFFD, so that two
// different events would share one id and the second get 409) are a 400
// naming the field, as are ids over 128 bytes. Valid escapes, U+FFFD
// included, are stored exactly. The negative control decodes ids as plain
// strings, as before.
func TestPostEventIDs(t *testing.T) {
	if err := checkIDs(t, startAPI(t, true)); err != nil {
		t.Fatal(err)
	}
	t.Run("negative control: ids decoded as plain strings", func(t *testing.T) {
		if err := checkIDs(t, startAPIWrapped(t, true, naiveDecode)); err == nil {
			t.Fatal("the check passed with ids decoded as plain strings")
		} else {
			t.Logf("caught, as it should: %v", err)
		}
	})
}

// checkIDLength checks that classify accepts ids of MaxIDLen bytes and
// refuses one more, for eventId and deviceId, naming the field.
func checkIDLength(classify func(Reading) (Classification, error)) error {
	for _, field := range []string{"eventId", "deviceId"} {
		for _, n := range []int{MaxIDLen, MaxIDLen + 1} {
			r := reading(TypeFall, 1, UnitBoolean)
			id := strings.Repeat("é", n/2) + strings.Repeat("x", n%2) // multi-byte: bytes, not characters, count
			if field == "eventId" {
				r.EventID = id
			} else {
				r.DeviceID = id
			}
			_, err := classify(r)
			var ie *InvalidError
			switch {
			case n <= MaxIDLen && err != nil:
				return fmt.Errorf("%s of %d bytes: %v, want accepted", field, n, err)
			case n > MaxIDLen && (!errors.As(err, &ie) || ie.Field != field):
				return fmt.Errorf("%s of %d bytes: %v, want an InvalidError for %s", field, n, err, field)
			}
		}
	}
	return nil
}

// Ids are at most 128 bytes (of UTF-8). The negative control classifies
// with no useful bound.
func TestClassifyIDLength(t *testing.T) {
	if err := checkIDLength(Classify); err != nil {
		t.Fatal(err)
	}
	t.Run("negative control: no length bound", func(t *testing.T) {
		if err := checkIDLength(func(r Reading) (Classification, error) { return classify(r, 1<<20) }); err == nil {
			t.Fatal("the check passed without a length bound")
		} else {
			t.Logf("caught, as it should: %v", err)
		}
	})
}
