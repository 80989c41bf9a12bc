package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/producer"
)

// A `bridge dlq replay` process killed by PID halfway, then run again:
// every dead-lettered event is delivered exactly once in total and the
// dead-letter stream ends empty.
func TestReplayKilledHalfwayThenRerun(t *testing.T) {
	// Given 30 events dead-lettered by a running bridge (destination 400).
	bin := bridgeBinary(t)
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	sink := sinktest.New(t, sinktest.Always(400))
	cfgPath := filepath.Join(t.TempDir(), "bridge.yaml")
	yaml := fmt.Sprintf(`
nats: {url: %s}
admin: {listen: ""}
destinations:
  d: {url: %s}
routes:
  - {name: r, subjects: ["events.>"], destination: d}
`, srv.URL(), sink.URL())
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	b, err := bridge.New(cfg, js, bridge.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-b.Ready()
	pub := producer.NewPublisher(js, "events")
	for i := range 30 {
		if _, err := pub.Publish(ctx, producer.Event{ID: fmt.Sprintf("e%02d", i), Type: "order.created", Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	dlq := bridge.OpenDLQ(js, cfg)
	natstest.Eventually(t, 20*time.Second, func() error {
		l, err := dlq.List(ctx, bridge.DLQFilter{}, false)
		if err != nil || len(l) != 30 {
			return fmt.Errorf("%d dead letters (%v), want 30", len(l), err)
		}
		return nil
	})
	natstest.WaitQuiet(t, js, cfg.Stream.Name, "r", 10*time.Second)
	rejected := sink.Count()
	sink.SetScript(sinktest.Always(200))

	// When a replay at 10 per second is killed after about half of them.
	var out natstest.Buffer
	replay := exec.Command(bin, "dlq", "replay", "--config", cfgPath, "--all", "--rate", "10")
	replay.Stdout, replay.Stderr = &out, &out
	if err := replay.Start(); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 20*time.Second, func() error {
		if n := strings.Count(out.String(), "replayed "); n < 15 {
			return fmt.Errorf("%d replayed so far", n)
		}
		return nil
	})
	if err := replay.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = replay.Wait()
	left, err := dlq.List(ctx, bridge.DLQFilter{}, false)
	if err != nil || len(left) == 0 || len(left) == 30 {
		t.Fatalf("after the kill %d dead letters are left (%v): the kill did not land halfway", len(left), err)
	}

	// And run again to completion.
	rerun, err := exec.Command(bin, "dlq", "replay", "--config", cfgPath, "--all").CombinedOutput()
	if err != nil {
		t.Fatalf("second replay: %v\n%s", err, rerun)
	}

	// Then every event reaches the destination exactly once after the fix,
	// and the dead-letter stream is empty.
	natstest.Eventually(t, 20*time.Second, func() error {
		if n := sink.Count() - rejected; n < 30 {
			return fmt.Errorf("%d of 30 delivered after the fix", n)
		}
		return nil
	})
	natstest.WaitQuiet(t, js, cfg.Stream.Name, "r", 10*time.Second)
	seen := map[string]int{}
	for _, r := range sink.Requests()[rejected:] {
		seen[r.Header.Get("X-Event-Id")]++
	}
	for i := range 30 {
		if id := fmt.Sprintf("e%02d", i); seen[id] != 1 {
			t.Errorf("event %s delivered %d times after the fix, want exactly 1", id, seen[id])
		}
	}
	if len(seen) != 30 {
		t.Errorf("%d distinct events delivered, want 30", len(seen))
	}
	if l, err := dlq.List(ctx, bridge.DLQFilter{}, false); err != nil || len(l) != 0 {
		t.Errorf("%d dead letters left (%v), want 0", len(l), err)
	}
}
