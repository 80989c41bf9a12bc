package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/deadletter"
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

// The reported attack, with the bridge binary: a producer allowed on
// events.> publishes its own message with the victim's Event-Id under the
// replay's Nats-Msg-Id. Under the old id (fall-7:replay:1, guessable) the
// replay is no longer fooled: it stores the real event and the receiver
// gets it. Under the replay's real id (for an attacker who somehow learnt
// it) the duplicate is read back and found to be another message: the
// command reports the collision and exits 1, and the dead letter stays
// with its payload.
func TestReplayAttackWithTheBinary(t *testing.T) {
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
	for _, id := range []string{"fall-7", "fall-8"} {
		srv.Publish(t, producer.Event{ID: id, Subject: "events.critical.sensor.fall", Payload: []byte(`{"patient":"p-1","event":"` + id + `"}`)})
		b.WaitDeadLetters(t, 1)
		b.WaitQuiet(t)
	}
	dls := b.WaitDeadLetters(t, 2)
	rec.SetScript(jetbridgetest.Always(200))
	attack := func(eventID, msgID string) producer.PublishResult {
		return srv.Publish(t, producer.Event{ID: msgID, Subject: "events.info.noise", Payload: []byte(`{"attacker":true}`)},
			jetbridgetest.WithHeader(producer.HeaderEventID, eventID))
	}
	replay := func(seq uint64) (string, int) {
		out, err := exec.Command(bin, "dlq", "replay", "--config", cfgPath, fmt.Sprint(seq)).CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		// Every replay writes one audit line (checked in cmd/bridge's
		// TestDLQAuditLine); what follows compares the rest.
		var rest []string
		audits := 0
		for _, l := range strings.SplitAfter(string(out), "\n") {
			if strings.HasPrefix(l, "audit: ") {
				audits++
				continue
			}
			rest = append(rest, l)
		}
		if audits != 1 {
			t.Fatalf("%d audit lines, want 1:\n%s", audits, out)
		}
		return strings.Join(rest, ""), code
	}

	// The old, guessable id: the replay of fall-8 is stored for real.
	attack("fall-8", "fall-8:replay:2")
	out, code := replay(2)
	if code != 0 || !strings.HasPrefix(out, "replayed dlq_seq=2 id=fall-8 -> events.critical.sensor.fall stream=EVENTS seq=") || strings.Contains(out, "(duplicate)") {
		t.Fatalf("replay of dead letter 2 after a planted fall-8:replay:2 (exit %d):\n%s", code, out)
	}
	if got := rec.WaitEvent(t, "fall-8"); !strings.Contains(string(got.Body), `"event":"fall-8"`) {
		t.Errorf("the receiver got fall-8 without its payload")
	}

	// The replay's own id: a collision, the dead letter kept.
	planted := attack("fall-7", deadletter.ReplayMsgID(dls[0]))
	out, code = replay(1)
	want := fmt.Sprintf("bridge: dead letter 1 kept: replay collision: EVENTS seq %d holds another message under this replay's Nats-Msg-Id "+
		"(different subject, Bridge-Replayed-From, payload); nothing was stored\nreplayed 0, duplicates 0, kept 0, failed 1\n", planted.Seq)
	if code != 1 || out != want {
		t.Fatalf("replay of dead letter 1 onto its planted id (exit %d):\n%s\nwant:\n%s", code, out, want)
	}
	left := b.DeadLetters(t)
	if len(left) != 1 || left[0].Seq != 1 || string(left[0].Data) != `{"patient":"p-1","event":"fall-7"}` {
		t.Errorf("dead letters after the collision: %d, want dead letter 1 with its payload", len(left))
	}
}
