package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
	"github.com/sotercare/jetbridge/producer"
)

// A `bridge dlq replay` process killed by PID halfway, then run again:
// every dead-lettered event is delivered exactly once in total and the
// dead-letter stream ends empty.
func TestReplayKilledHalfwayThenRerun(t *testing.T) {
	// Given 30 events dead-lettered by a running bridge (destination 400).
	bin := bridgeBinary(t)
	srv := jetbridgetest.NewServer(t)
	rec := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(jetbridgetest.Always(400)))
	cfgPath := filepath.Join(t.TempDir(), "bridge.yaml")
	yaml := fmt.Sprintf(`
nats: {url: %s}
admin: {listen: ""}
destinations:
  d: {url: %s}
routes:
  - {name: r, subjects: ["events.>"], destination: d}
`, srv.URL(), rec.URL())
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	b := jetbridgetest.StartBridge(t, srv, yaml)
	for i := range 30 {
		srv.Publish(t, producer.Event{ID: fmt.Sprintf("e%02d", i), Type: "order.created", Payload: []byte(`{}`)})
	}
	b.WaitDeadLetters(t, 30)
	b.WaitQuiet(t)
	rejected := rec.Count()
	rec.SetScript(jetbridgetest.Always(200))

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
	if left := b.DeadLetters(t); len(left) == 0 || len(left) == 30 {
		t.Fatalf("after the kill %d dead letters are left: the kill did not land halfway", len(left))
	}

	// And run again to completion.
	rerun, err := exec.Command(bin, "dlq", "replay", "--config", cfgPath, "--all").CombinedOutput()
	if err != nil {
		t.Fatalf("second replay: %v\n%s", err, rerun)
	}

	// Then every event reaches the destination exactly once after the fix,
	// and the dead-letter stream is empty.
	rec.WaitCount(t, rejected+30)
	b.WaitQuiet(t)
	seen := map[string]int{}
	for _, r := range rec.Requests()[rejected:] {
		seen[r.EventID()]++
	}
	for i := range 30 {
		if id := fmt.Sprintf("e%02d", i); seen[id] != 1 {
			t.Errorf("event %s delivered %d times after the fix, want exactly 1", id, seen[id])
		}
	}
	if len(seen) != 30 {
		t.Errorf("%d distinct events delivered, want 30", len(seen))
	}
	if l := b.DeadLetters(t); len(l) != 0 {
		t.Errorf("%d dead letters left, want 0", len(l))
	}
}
