package test

import (
	"strconv"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
)

// A bridge killed with SIGKILL in the middle of a 2,000-event backlog and
// started again loses nothing: the messages it held come back after
// ack_wait and the backlog drains. Only the events in flight at the kill
// reach the destination twice (at most max_in_flight of them), with or
// without route idempotency: the requests cut off by the kill never got
// their 2xx, so the reservation of each is taken over and it is sent again.
func TestBridgeKilledMidBacklog(t *testing.T) {
	for _, idem := range []bool{false, true} {
		t.Run("idempotency="+strconv.FormatBool(idem), func(t *testing.T) {
			crashScenario(t, idem)
		})
	}
}

func crashScenario(t *testing.T, idempotency bool) {
	const (
		n           = 2000
		killAfter   = 1000
		maxInFlight = 64
		destDelay   = 20 * time.Millisecond
	)
	// Given a backlog of 2,000 events, a destination taking 20 ms per
	// request and a bridge process working through them
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	sink := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(delayed(destDelay)))
	sc := scenario{
		natsURL: srv.URL(), sinkURL: sink.URL(),
		maxInFlight: maxInFlight, ackWait: 2 * time.Second, shutdownTimeout: 5 * time.Second,
		idempotency: idempotency,
	}
	sc.provision(t, js)
	l := natstest.NewLedger("crash", n)
	l.Publish(t, js, "events.info.crash")
	path := sc.file(t)
	first := runBridge(t, path)

	// When it is killed with SIGKILL after about 1,000 requests
	waitCount(t, sink, killAfter, countTimeout)
	killAt := time.Now()
	first.kill(t)
	killedAt := time.Now() // reaped: nothing it sent can arrive after this
	atKill := sink.Count()

	// And started again
	restartAt := time.Now()
	second := runBridge(t, path)
	natstest.WaitQuiet(t, js, streamName, routeName, quietTimeout)
	drained := time.Since(restartAt)

	// Then every event was delivered, none dead-lettered, and only events
	// in flight at the kill were sent twice
	reqs := sink.Requests()
	r := account(t, js, l, reqs)
	recent := 0 // requests that arrived within one destination delay before the kill
	for _, q := range reqs[:atKill] {
		if q.At.After(killedAt.Add(-destDelay)) {
			recent++
		}
	}
	t.Logf("killed after %d requests (%d in the last %s; kill took %s); restart to quiet %s; %s",
		atKill, recent, destDelay, killedAt.Sub(killAt).Round(time.Microsecond), drained.Round(time.Millisecond), r)
	if r.DeadLettered != 0 {
		t.Errorf("%d events dead-lettered, want 0", r.DeadLettered)
	}
	if r.DuplicateCount > maxInFlight {
		t.Errorf("%d duplicate requests, want at most max_in_flight = %d", r.DuplicateCount, maxInFlight)
	}
	groups := byEventID(reqs)
	var oldest time.Duration // how long before the kill the oldest duplicated event was sent
	for id, extra := range r.Duplicates {
		copies := groups[id]
		oldest = max(oldest, killedAt.Sub(copies[0].At))
		if extra != 1 {
			t.Errorf("event %s sent %d times, want at most twice", id, extra+1)
		}
		// The first copy was in flight at the kill: sent shortly before it
		// (well within ack_wait), the second one after the restart as a
		// redelivery.
		if at := copies[0].At; at.After(killedAt) || at.Before(killAt.Add(-sc.ackWait)) {
			t.Errorf("event %s: first copy sent %s before the kill, want it in flight then", id, killedAt.Sub(at))
		}
		last := copies[len(copies)-1]
		if last.At.Before(restartAt) || last.Header.Get("X-Delivery-Attempt") == "1" {
			t.Errorf("event %s: second copy at %s (attempt %s), want a redelivery after the restart",
				id, last.At.Sub(restartAt), last.Header.Get("X-Delivery-Attempt"))
		}
	}
	skipped := second.metric(t, "bridge_messages_total", `outcome="duplicate_skipped"`)
	t.Logf("the duplicated events were first sent at most %s before the kill; the restarted bridge skipped %v redeliveries as already delivered",
		oldest.Round(time.Microsecond), skipped)
	if info := consumerInfo(t, js); info.Delivered.Stream != n || info.AckFloor.Stream != n {
		t.Errorf("consumer delivered up to stream seq %d, ack floor %d; want %d and %d", info.Delivered.Stream, info.AckFloor.Stream, n, n)
	}
}
