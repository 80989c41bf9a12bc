package bridge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/subjects"
)

// referenceEnvelope is the envelope as encoding/json renders it (the
// implementation before the hand-written encoder), kept as the oracle.
func referenceEnvelope(ev *event) ([]byte, error) {
	md := ev.Metadata
	if md == nil {
		md = map[string]string{}
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, ev.Payload); err != nil {
		return nil, err
	}
	return json.Marshal(struct {
		ID          string            `json:"id"`
		EventType   string            `json:"eventType"`
		Severity    subjects.Severity `json:"severity"`
		Subject     string            `json:"subject"`
		Metadata    map[string]string `json:"metadata"`
		Payload     json.RawMessage   `json:"payload"`
		PublishedAt string            `json:"publishedAt"`
	}{ev.ID, ev.Type, ev.Severity, ev.Subject, md, compact.Bytes(), ev.PublishedAt.UTC().Format(time.RFC3339Nano)})
}

var tricky = []string{
	"", "plain", `quote " and \ backslash`, "<script>&amp;</script>", "tab\tnewline\nreturn\r",
	"\b\f\x00\x01\x1f\x7f", "caf\u00e9 \u65e5\u672c", "line\u2028para\u2029", "bad \xff\xfe utf8 \xc3",
	"emoji \U0001F600", "\xed\xa0\x80 surrogate",
}

// The hand-written envelope encoder gives exactly encoding/json's bytes
// for every string, and the payload as it was published.
func TestEnvelopeMatchesEncodingJSON(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.FixedZone("x", 3600))
	for i, s := range tricky {
		for _, payload := range []string{`{"a":1}`, `[1,2,{"b":"<&>"}]`, `"str"`, `null`} {
			ev := &event{
				ID: "id-" + s, Type: s, Severity: subjects.Critical, Subject: "events.critical." + fmt.Sprint(i),
				Payload: []byte(payload), PublishedAt: at,
				Metadata: map[string]string{s: s, "z": "last", "a": "first"},
			}
			if i == 0 {
				ev.Metadata = nil
			}
			want, err := referenceEnvelope(ev)
			if err != nil {
				t.Fatal(err)
			}
			// encoding/json HTML-escapes inside a RawMessage too; the
			// bridge copies the validated payload as published.
			want = bytes.Replace(want, []byte(`\u003c\u0026\u003e`), []byte(`<&>`), 1)
			if got := appendEnvelope(nil, ev); !bytes.Equal(got, want) {
				t.Fatalf("string %q payload %s:\n got %s\nwant %s", s, payload, got, want)
			}
		}
	}
}

// The payload is copied byte for byte (whitespace kept), and the result is
// valid JSON that decodes to the same values as the reference.
func TestEnvelopeKeepsPayloadBytes(t *testing.T) {
	payload := []byte("{ \"a\" : [ 1, 2 ],\n \"b\":\"x\" }")
	ev := &event{ID: "e", Type: "t", Severity: subjects.Info, Subject: "events.info.t", Payload: payload}
	got := appendEnvelope(nil, ev)
	if !bytes.Contains(got, payload) {
		t.Fatalf("payload not copied as published: %s", got)
	}
	want, err := referenceEnvelope(ev)
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	if err := json.Unmarshal(got, &a); err != nil {
		t.Fatalf("envelope is not JSON: %v: %s", err, got)
	}
	if err := json.Unmarshal(want, &b); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("decoded envelope differs:\n got %v\nwant %v", a, b)
	}
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range tricky {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSONString(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("%q: got %s want %s", s, got, want)
		}
	})
}

func BenchmarkEnvelope(b *testing.B) {
	ev := &event{
		ID: "01JD3Q8Z6Y5K", Type: "care.alert.fall", Severity: subjects.Critical, Subject: "events.critical.care.alert.fall",
		Payload: bytes.Repeat([]byte(`{"k":"v"},`), 100), PublishedAt: time.Now(),
		Metadata: map[string]string{"resident": "r-42"},
	}
	ev.Payload = append(append([]byte("["), ev.Payload[:len(ev.Payload)-1]...), ']')
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 2048)
		for range b.N {
			buf = appendEnvelope(buf[:0], ev)
		}
	})
	b.Run("encoding_json_reference", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := referenceEnvelope(ev); err != nil {
				b.Fatal(err)
			}
		}
	})
}
