package test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
)

// readyzTimeout bounds how long /readyz takes to follow a stream change
// (the readiness watch runs every 2 s).
const readyzTimeout = 20 * time.Second

// /readyz follows the streams of a running bridge: the source stream
// deleted makes it 503 naming the stream; created again (as an operator
// would), it is 200 again and the bridge delivers from it. The dead-letter
// stream deleted makes it 503 naming that stream. The negative controls
// are in the bridge package (TestReadinessFollowsStreams).
func TestReadyzFollowsStreams(t *testing.T) {
	srv := jetbridgetest.NewServer(t)
	sink := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(jetbridgetest.Always(200)))
	s := scenario{natsURL: srv.URL(), sinkURL: sink.URL(), maxInFlight: 4, ackWait: 5 * time.Second, shutdownTimeout: 2 * time.Second}
	p := runBridge(t, s.file(t))
	_, js := srv.Connect(t)
	ctx := t.Context()

	waitReason := func(want string) {
		t.Helper()
		natstest.Eventually(t, readyzTimeout, func() error {
			p.failIfExited(t)
			code, body := adminGet(p.admin, "/readyz")
			if code != http.StatusServiceUnavailable || !strings.Contains(body, want) {
				return fmt.Errorf("/readyz = %d %s, want 503 naming %q", code, body, want)
			}
			return nil
		})
	}

	stream, err := js.Stream(ctx, streamName)
	if err != nil {
		t.Fatal(err)
	}
	sc := stream.CachedInfo().Config
	if err := js.DeleteStream(ctx, streamName); err != nil {
		t.Fatal(err)
	}
	waitReason("stream " + streamName + " does not exist")

	if _, err := js.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	p.waitReadyz(t, http.StatusOK, readyzTimeout)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := js.Publish(pctx, "events.info.readyz", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	waitCount(t, sink, 1, countTimeout)

	if err := js.DeleteStream(ctx, dlqStream); err != nil {
		t.Fatal(err)
	}
	waitReason("dead-letter stream " + dlqStream + " does not exist")
	if code, _ := adminGet(p.admin, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d with a stream missing, want 200 (it reports the process and its connection)", code)
	}
}
