package test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
)

// The NATS server goes away in the middle of a 2,000-event backlog and
// comes back on the same store dir: the bridge process keeps running,
// /readyz answers 503 while it is disconnected and 200 again after,
// delivery resumes within 5 s of the server being ready, and no event is
// lost. (a) A clean shutdown and restart of an in-process server: it
// persists every ack it processed, so only the messages the bridge held
// (at most max_in_flight) are sent again.
func TestServerRestartMidFlow(t *testing.T) {
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	o := serverOutage(t, srv.URL(), js, srv.Shutdown, func() { srv.Restart(t) })
	if o.report.DuplicateCount > outageInFlight {
		t.Errorf("%d duplicate requests, want at most max_in_flight = %d", o.report.DuplicateCount, outageInFlight)
	}
}

// (b) The server is a child process killed with SIGKILL; a new one starts
// on its store dir and port. The killed server's consumer state on disk
// can lag its last acks by its flush interval (about 100 ms, nats-notes
// 1.2), so recently acked events are sent again too: every duplicate must
// have been first sent shortly before the kill (within 1 s), never earlier.
func TestServerKilledMidFlow(t *testing.T) {
	dir, addr := t.TempDir(), freeAddr(t)
	child := natstest.StartChild(t, "TestChildNatsd", natsdRole,
		"JETBRIDGE_TEST_STORE_DIR="+dir, "JETBRIDGE_TEST_NATS_LISTEN="+addr)
	natstest.Eventually(t, readyTimeout, func() error {
		if !strings.Contains(child.Output(), "natsd ready") {
			return errors.New("the nats-server child is not ready")
		}
		return nil
	})
	url := "nats://" + addr
	_, js := natstest.Connect(t, url)
	o := serverOutage(t, url, js, child.Kill, func() {
		natstest.Start(t, natstest.WithStoreDir(dir), natstest.WithListen(addr))
		natstest.Eventually(t, readyTimeout, func() error {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			_, err := js.Stream(ctx, streamName)
			return err
		})
	})
	const staleAcks = time.Second
	groups := byEventID(o.reqs)
	for id, extra := range o.report.Duplicates {
		first := groups[id][0].At
		if extra != 1 || first.Before(o.downAt.Add(-staleAcks)) {
			t.Errorf("event %s sent %d times, first %s before the kill; want twice at most, first within %s of the kill",
				id, extra+1, o.downAt.Sub(first).Round(time.Millisecond), staleAcks)
		}
	}
}

// outageInFlight is the route's max_in_flight in the outage scenarios.
const outageInFlight = 32

// outage is what serverOutage observed.
type outage struct {
	report natstest.LedgerReport
	reqs   []jetbridgetest.Request
	downAt time.Time
}

// serverOutage runs the scenario against the server at url: down takes it
// away after about half the backlog was sent, up brings it back and returns
// once it answers JetStream requests.
func serverOutage(t *testing.T, url string, js jetstream.JetStream, down, up func()) outage {
	const (
		n           = 2000
		downAfter   = 1000
		destDelay   = 20 * time.Millisecond
		resumeBound = 5 * time.Second
	)
	// Given a backlog of 2,000 events and a bridge process delivering them
	sink := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(delayed(destDelay)))
	sc := scenario{
		natsURL: url, sinkURL: sink.URL(),
		maxInFlight: outageInFlight, ackWait: 2 * time.Second, shutdownTimeout: 5 * time.Second,
	}
	sc.provision(t, js)
	l := natstest.NewLedger("outage", n)
	l.Publish(t, js, "events.info.outage")
	b := runBridge(t, sc.file(t))
	waitCount(t, sink, downAfter, countTimeout)

	// When the server goes down
	downAt := time.Now()
	down()
	atDown := sink.Count()

	// Then /readyz answers 503
	notReady := b.waitReadyz(t, 503, 10*time.Second).Sub(downAt)

	// When it comes back
	up()
	upAt := time.Now()

	// Then /readyz answers 200 again and delivery resumes within 5 s
	ready := b.waitReadyz(t, 200, 10*time.Second).Sub(upAt)
	var resumed time.Duration
	natstest.Eventually(t, time.Until(upAt.Add(resumeBound)), func() error {
		reqs := sink.Requests()
		if last := reqs[len(reqs)-1]; last.At.After(upAt) {
			resumed = last.At.Sub(upAt)
			return nil
		}
		return fmt.Errorf("no request since the server came back %s ago", time.Since(upAt).Round(time.Millisecond))
	})
	if resumed > resumeBound {
		t.Errorf("delivery resumed %s after the server was ready, want within %s", resumed.Round(time.Millisecond), resumeBound)
	}
	b.failIfExited(t)

	// And the backlog drains with nothing lost, nothing dead-lettered
	natstest.WaitQuiet(t, js, streamName, routeName, quietTimeout)
	drained := time.Since(upAt)
	reqs := sink.Requests()
	r := account(t, js, l, reqs)
	t.Logf("down after %d requests, /readyz 503 %s later; up %s after down: /readyz 200 %s later, first request %s later, quiet %s later; %s",
		atDown, notReady.Round(time.Millisecond), upAt.Sub(downAt).Round(time.Millisecond),
		ready.Round(time.Millisecond), resumed.Round(time.Millisecond), drained.Round(time.Millisecond), r)
	if r.DeadLettered != 0 {
		t.Errorf("%d events dead-lettered, want 0", r.DeadLettered)
	}
	return outage{report: r, reqs: reqs, downAt: downAt}
}
