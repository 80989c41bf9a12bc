package sotercare

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/tracing"
)

// A reading posted with a traceparent is published in the caller's trace
// (as cmd/sotercare wires the publisher); a malformed one is not
// forwarded.
func TestPostEventContinuesCallersTrace(t *testing.T) {
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
	if err != nil {
		t.Fatal(err)
	}
	h := NewHandler(producer.NewPublisher(js, "events", producer.WithHeaders(tracing.Inject)), Options{PublishTimeout: 2 * time.Second})
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for i, tc := range []struct{ sent, stored string }{
		{parent, parent},
		{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331", ""}, // malformed
	} {
		body := `{"eventId":"fall-000` + string(rune('1'+i)) + `","deviceId":"bed-3","eventType":"fall","value":1,"unit":"boolean","timestamp":1735689600000}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/api/v1/events", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Traceparent", tc.sent)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("post %d: %d", i, resp.StatusCode)
		}
		m, err := stream.GetMsg(ctx, uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Header.Get("traceparent"); got != tc.stored {
			t.Fatalf("post %d: stored traceparent %q, want %q", i, got, tc.stored)
		}
	}
}
