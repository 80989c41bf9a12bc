package test

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
)

// SIGHUP never stops the bridge (docs/deploy.md#signals): with the real
// binary, a SIGHUP with a valid file is logged as valid and counted
// needs_restart, one with a broken file is logged with the file's error
// and counted invalid; the bridge keeps delivering with the configuration
// it started with, and SIGTERM still drains and exits 0.
func TestSIGHUPValidatesAndNeverStops(t *testing.T) {
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	sink := jetbridgetest.NewReceiver(t)
	sc := scenario{natsURL: srv.URL(), sinkURL: sink.URL(), maxInFlight: 4, ackWait: 30 * time.Second, shutdownTimeout: 5 * time.Second}
	path := sc.file(t)
	b := runBridge(t, path)
	l := natstest.NewLedger("hup", 2)
	l.PublishOne(t, js, "events.info.hup", 1)
	waitCount(t, sink, 1, countTimeout)

	reloads := func(result string) float64 {
		return b.metric(t, "bridge_config_reloads_total", `result="`+result+`"`)
	}
	hup := func() {
		t.Helper()
		if err := b.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatalf("SIGHUP: %v", err)
		}
	}
	// A valid file: logged as valid, counted needs_restart.
	hup()
	natstest.Eventually(t, countTimeout, func() error {
		b.failIfExited(t)
		if reloads("needs_restart") != 1 {
			return errString("needs_restart not counted yet")
		}
		return nil
	})
	if !strings.Contains(b.stdout.String(), "SIGHUP: the configuration file is valid; it takes effect at the next start") {
		t.Errorf("no log line for the valid file:\n%s", b.stdout.String())
	}

	// A broken file: logged with the key and line, counted invalid.
	if err := os.WriteFile(path, []byte(sc.yaml()+"  - name: x\n    subjects: [\"events.>\"]\n    destination: nowhere\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hup()
	natstest.Eventually(t, countTimeout, func() error {
		b.failIfExited(t)
		if reloads("invalid") != 1 {
			return errString("invalid not counted yet")
		}
		return nil
	})
	out := b.stdout.String()
	if !strings.Contains(out, "SIGHUP: the configuration file is invalid; the running configuration is unchanged") ||
		!strings.Contains(out, `routes[1].destination`) {
		t.Errorf("no log line naming the broken key:\n%s", out)
	}
	if got := []float64{reloads("applied"), reloads("invalid"), reloads("needs_restart")}; got[0] != 0 || got[1] != 1 || got[2] != 1 {
		t.Errorf("reloads applied/invalid/needs_restart = %v, want [0 1 1]", got)
	}

	// Still delivering, then SIGTERM drains and exits 0.
	l.PublishOne(t, js, "events.info.hup", 2)
	waitCount(t, sink, 2, countTimeout)
	b.term(t)
	if code := b.wait(t, 10*time.Second); code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0", code)
	}
	if got := sink.Count(); got != 2 {
		t.Errorf("the destination got %d requests, want 2", got)
	}
}

type errString string

func (e errString) Error() string { return string(e) }
