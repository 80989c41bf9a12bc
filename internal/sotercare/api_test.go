package sotercare

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/producer"
)

// apiEnv is the API on httptest, publishing to an embedded JetStream with
// an EVENTS stream on events.>.
type apiEnv struct {
	url string
	js  jetstream.JetStream
}

func startAPI(t *testing.T, withStream bool) *apiEnv {
	t.Helper()
	return startAPIWrapped(t, withStream, func(h http.Handler) http.Handler { return h })
}

// startAPIWrapped is startAPI with the handler wrapped by wrap (a
// negative control's broken variant).
func startAPIWrapped(t *testing.T, withStream bool, wrap func(http.Handler) http.Handler) *apiEnv {
	t.Helper()
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL(), nats.ReconnectBufSize(-1))
	if withStream {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
			Name: "EVENTS", Subjects: []string{"events.>"}, Duplicates: 2 * time.Minute,
		}); err != nil {
			t.Fatal(err)
		}
	}
	h := NewHandler(producer.NewPublisher(js, "events"), Options{PublishTimeout: 2 * time.Second})
	hs := httptest.NewServer(wrap(h))
	t.Cleanup(hs.Close)
	return &apiEnv{url: hs.URL, js: js}
}

type response struct {
	status int
	header http.Header
	body   string
}

func (e *apiEnv) do(t *testing.T, method, path, body string, hdr map[string]string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, e.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func TestHealth(t *testing.T) {
	e := startAPI(t, false)
	r := e.do(t, http.MethodGet, "/api/v1/health", "", nil)
	if r.status != http.StatusOK || r.body != `{"status":"UP"}`+"\n" {
		t.Fatalf("health: %d %q", r.status, r.body)
	}
	if r := e.do(t, http.MethodGet, "/api/v1/events", "", nil); r.status != http.StatusMethodNotAllowed {
		t.Fatalf("GET /api/v1/events: %d, want 405", r.status)
	}
}

// Accepted, duplicate and correlation ids, with the exact bodies.
func TestPostEvent(t *testing.T) {
	e := startAPI(t, true)
	fall := `{"eventId":"fall-0001","deviceId":"bed-3","eventType":"fall","value":1,"unit":"boolean","timestamp":1735689600000}`

	r := e.do(t, http.MethodPost, "/api/v1/events", fall, map[string]string{correlationHeader: "req-42"})
	want := `{"eventId":"fall-0001","status":"accepted","severity":"critical","routedTo":"caregiver","stream":"EVENTS","seq":1,"correlationId":"req-42"}` + "\n"
	if r.status != http.StatusAccepted || r.body != want || r.header.Get(correlationHeader) != "req-42" {
		t.Fatalf("first post: %d %q (correlation %q), want 202 %q", r.status, r.body, r.header.Get(correlationHeader), want)
	}
	stream, err := e.js.Stream(t.Context(), "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.GetMsg(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Subject != "events.critical.care.caregiver.bed-3.fall" || msg.Header.Get("Nats-Msg-Id") != "fall-0001" ||
		msg.Header.Get("Event-Meta-correlationId") != "req-42" {
		t.Fatalf("stored %s with headers %v", msg.Subject, msg.Header)
	}

	r = e.do(t, http.MethodPost, "/api/v1/events", fall, nil)
	if r.status != http.StatusConflict || r.body != `{"code":"DUPLICATE_EVENT"}`+"\n" {
		t.Fatalf("second post: %d %q, want 409 DUPLICATE_EVENT", r.status, r.body)
	}

	// Without a usable X-Correlation-Id each request gets a new one.
	ids := map[string]bool{}
	for i, hdr := range []map[string]string{nil, {correlationHeader: "has space"}, {correlationHeader: strings.Repeat("x", 129)}} {
		body := strings.Replace(fall, "fall-0001", "fall-100"+string(rune('0'+i)), 1)
		r := e.do(t, http.MethodPost, "/api/v1/events", body, hdr)
		var rc Receipt
		if err := json.Unmarshal([]byte(r.body), &rc); err != nil || r.status != http.StatusAccepted {
			t.Fatalf("post %d: %d %q", i, r.status, r.body)
		}
		if rc.CorrelationID == "" || rc.CorrelationID != r.header.Get(correlationHeader) || ids[rc.CorrelationID] {
			t.Fatalf("post %d: correlation id %q (header %q), seen before: %v", i, rc.CorrelationID, r.header.Get(correlationHeader), ids[rc.CorrelationID])
		}
		ids[rc.CorrelationID] = true
	}
}

// Every kind of bad request is a 400 INVALID_EVENT whose message names the
// problem and never quotes the body.
func TestPostEventInvalid(t *testing.T) {
	e := startAPI(t, false) // nothing reaches the broker
	tests := []struct{ name, body, message string }{
		{"malformed JSON", `{"eventId":"fall-0001",`, "body: malformed JSON: unexpected end"},
		{"not JSON", `secret-canary`, "body: malformed JSON at byte 1"},
		{"empty body", ``, "body: is empty"},
		{"an array", `[1,2]`, "body: malformed JSON: want an object"},
		{"two objects", `{} {}`, "body: malformed JSON: more than one value"},
		{"value as a string", `{"eventId":"fall-0001","deviceId":"bed-3","eventType":"fall","value":"secret-canary","unit":"boolean","timestamp":1}`, "value: must be a number"},
		{"fractional timestamp", `{"eventId":"fall-0001","deviceId":"bed-3","eventType":"fall","value":1,"unit":"boolean","timestamp":1.5}`, "timestamp: must be an integer"},
		{"missing value", `{"eventId":"fall-0001","deviceId":"bed-3","eventType":"fall","unit":"boolean","timestamp":1}`, "value: is required"},
		{"null timestamp", `{"eventId":"fall-0001","deviceId":"bed-3","eventType":"fall","value":1,"unit":"boolean","timestamp":null}`, "timestamp: is required"},
		{"unsupported type", `{"eventId":"temp-0001","deviceId":"bed-3","eventType":"temperature","value":37,"unit":"celsius","timestamp":1}`, "eventType: unsupported; use fall, vitals or moisture"},
		{"out of range", `{"eventId":"vit-0001","deviceId":"bed-3","eventType":"vitals","value":241,"unit":"bpm","timestamp":1}`, "value: vitals must be 30 to 240 bpm"},
		{"wrong unit", `{"eventId":"vit-0001","deviceId":"bed-3","eventType":"vitals","value":72,"unit":"percent","timestamp":1}`, "unit: vitals readings are in bpm"},
		{"short eventId", `{"eventId":"e-1","deviceId":"bed-3","eventType":"fall","value":1,"unit":"boolean","timestamp":1}`, "eventId: must be at least 4 characters"},
		{"too large", `{"eventId":"` + strings.Repeat("x", maxBody) + `"}`, "body: larger than 65536 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do(t, http.MethodPost, "/api/v1/events", tt.body, nil)
			var got APIError
			if err := json.Unmarshal([]byte(r.body), &got); err != nil {
				t.Fatalf("%d %q: %v", r.status, r.body, err)
			}
			if r.status != http.StatusBadRequest || got.Code != CodeInvalidEvent || got.Message != tt.message {
				t.Fatalf("got %d %+v, want 400 %s %q", r.status, got, CodeInvalidEvent, tt.message)
			}
			if strings.Contains(r.body, "secret-canary") {
				t.Fatalf("the response quotes the body: %s", r.body)
			}
		})
	}
}

// With no stream to store it, a valid reading is a 503: not stored.
func TestPostEventNoStream(t *testing.T) {
	e := startAPI(t, false)
	r := e.do(t, http.MethodPost, "/api/v1/events",
		`{"eventId":"fall-0001","deviceId":"bed-3","eventType":"fall","value":1,"unit":"boolean","timestamp":1}`, nil)
	if r.status != http.StatusServiceUnavailable || r.body != `{"code":"BROKER_UNAVAILABLE"}`+"\n" {
		t.Fatalf("got %d %q, want 503 BROKER_UNAVAILABLE", r.status, r.body)
	}
}
