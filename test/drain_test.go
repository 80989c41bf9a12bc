package test

import (
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
)

// Graceful drain on SIGTERM (docs/operating.md#shutdown), with the real binary:
// 50 attempts in flight on a destination taking 2 s each and 30 more
// events waiting. The bridge takes nothing more, lets the 50 finish, acks
// them and exits 0; restarted, it delivers the other 30 and nothing is
// ever redelivered.
func TestSIGTERMDrainsInFlight(t *testing.T) {
	const (
		inFlight        = 50
		waiting         = 30
		n               = inFlight + waiting
		destDelay       = 2 * time.Second
		shutdownTimeout = 10 * time.Second
	)
	// Given 50 requests in flight (max_in_flight 50) and 30 events waiting
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	sink := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(func(r jetbridgetest.Request) jetbridgetest.Response {
		if r.N <= inFlight {
			return jetbridgetest.Response{Delay: destDelay}
		}
		return jetbridgetest.Response{}
	}))
	sc := scenario{
		natsURL: srv.URL(), sinkURL: sink.URL(),
		maxInFlight: inFlight, ackWait: 30 * time.Second, shutdownTimeout: shutdownTimeout,
	}
	sc.provision(t, js)
	l := natstest.NewLedger("drain", n)
	l.Publish(t, js, "events.info.drain")
	path := sc.file(t)
	b := runBridge(t, path)
	waitCount(t, sink, inFlight, countTimeout)

	// When it gets SIGTERM
	sigAt := time.Now()
	b.term(t)

	// Then it exits 0 within shutdown_timeout + 1 s, once the 50 are done
	code := b.wait(t, shutdownTimeout+time.Second)
	exitAfter := time.Since(sigAt)
	t.Logf("exit %d %s after SIGTERM", code, exitAfter.Round(time.Millisecond))
	if code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	// And it sent nothing after the signal, took no other message, and
	// acked the 50 (consumer sequence 50: no delivery besides them)
	if got := sink.Count(); got != inFlight {
		t.Errorf("the destination received %d requests, want only the %d in flight at the signal", got, inFlight)
	}
	info := consumerInfo(t, js)
	if info.Delivered.Consumer != inFlight || info.AckFloor.Stream != inFlight || info.NumAckPending != 0 || info.NumPending != waiting {
		t.Errorf("after exit: delivered %d, ack floor stream seq %d, ack pending %d, pending %d; want %d, %d, 0, %d",
			info.Delivered.Consumer, info.AckFloor.Stream, info.NumAckPending, info.NumPending, inFlight, inFlight, waiting)
	}

	// When it is started again
	runBridge(t, path)
	natstest.WaitQuiet(t, js, streamName, routeName, quietTimeout)

	// Then the other 30 are delivered and every event was sent exactly once:
	// 80 deliveries in all, none a redelivery
	r := account(t, js, l, sink.Requests())
	if r.DuplicateCount != 0 || r.DeadLettered != 0 {
		t.Errorf("%s; want every event delivered exactly once", r)
	}
	if info := consumerInfo(t, js); info.Delivered.Consumer != n || info.NumRedelivered != 0 {
		t.Errorf("consumer made %d deliveries (%d redelivered), want %d, none redelivered", info.Delivered.Consumer, info.NumRedelivered, n)
	}
}

// With a short shutdown_timeout the attempts still running are cut off and
// handed back for a prompt redelivery (NakWithDelay, not ack_wait, which is
// 30 s here): a restarted bridge delivers them at once.
func TestSIGTERMCutsOffAfterShutdownTimeout(t *testing.T) {
	const (
		inFlight        = 50
		waiting         = 30
		n               = inFlight + waiting
		destDelay       = 3 * time.Second
		shutdownTimeout = 500 * time.Millisecond
		ackWait         = 30 * time.Second
		prompt          = 5 * time.Second // well under ack_wait
	)
	// Given 50 requests in flight on a destination taking 3 s each
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	sink := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(func(r jetbridgetest.Request) jetbridgetest.Response {
		if r.N <= inFlight {
			return jetbridgetest.Response{Delay: destDelay}
		}
		return jetbridgetest.Response{}
	}))
	sc := scenario{
		natsURL: srv.URL(), sinkURL: sink.URL(),
		maxInFlight: inFlight, ackWait: ackWait, shutdownTimeout: shutdownTimeout,
	}
	sc.provision(t, js)
	l := natstest.NewLedger("cut", n)
	l.Publish(t, js, "events.info.cut")
	path := sc.file(t)
	b := runBridge(t, path)
	waitCount(t, sink, inFlight, countTimeout)

	// When it gets SIGTERM
	sigAt := time.Now()
	b.term(t)

	// Then it exits 0 within shutdown_timeout + 1 s, sending nothing more
	code := b.wait(t, shutdownTimeout+time.Second)
	exitAfter := time.Since(sigAt)
	if code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if got := sink.Count(); got != inFlight {
		t.Errorf("the destination received %d requests, want only the %d in flight at the signal", got, inFlight)
	}
	if info := consumerInfo(t, js); info.Delivered.Consumer != inFlight || info.AckFloor.Stream != 0 {
		t.Errorf("after exit: delivered %d, ack floor stream seq %d; want %d, 0", info.Delivered.Consumer, info.AckFloor.Stream, inFlight)
	}

	// When it is started again
	restartAt := time.Now()
	runBridge(t, path)

	// Then the 50 cut off come back promptly, each as delivery 2, and the
	// other 30 are delivered once
	waitCount(t, sink, n+inFlight, prompt)
	redelivered := time.Since(restartAt)
	natstest.WaitQuiet(t, js, streamName, routeName, quietTimeout)
	reqs := sink.Requests()
	r := account(t, js, l, reqs)
	t.Logf("exit 0 %s after SIGTERM; the %d cut off were redelivered within %s of the restart; %s",
		exitAfter.Round(time.Millisecond), inFlight, redelivered.Round(time.Millisecond), r)
	for id, copies := range byEventID(reqs) {
		want := []string{"1"}
		if copies[0].N <= inFlight {
			want = []string{"1", "2"}
		}
		if len(copies) != len(want) {
			t.Errorf("event %s sent %d times, want %d", id, len(copies), len(want))
			continue
		}
		for i, c := range copies {
			if got := c.Header.Get("X-Delivery-Attempt"); got != want[i] {
				t.Errorf("event %s copy %d: X-Delivery-Attempt %s, want %s", id, i+1, got, want[i])
			}
		}
	}
	if info := consumerInfo(t, js); info.Delivered.Consumer != n+inFlight {
		t.Errorf("consumer made %d deliveries, want %d", info.Delivered.Consumer, n+inFlight)
	}
}
