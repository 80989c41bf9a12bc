package jetbridgetest

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// postEvent sends one request carrying event id to the receiver, as the
// bridge would.
func postEvent(t testing.TB, rec *Receiver, id string) {
	req, err := http.NewRequest(http.MethodPost, rec.URL()+"/x", strings.NewReader("{}"))
	if err != nil {
		t.Error(err)
		return
	}
	req.Header.Set(HeaderEventID, id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return
	}
	resp.Body.Close()
}

// whileRunning runs assert (with a fatalTB) and, until it returns, posts
// requests for the ids that next gives, one after the other: some arrive
// after assert started, whenever exactly that is. It returns assert's
// failure message and how long assert took.
func whileRunning(t *testing.T, rec *Receiver, next func(i int) string, assert func(tb testing.TB)) (string, time.Duration) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			postEvent(t, rec, next(i))
		}
	}()
	start := time.Now()
	msg := failure(t, assert)
	took := time.Since(start)
	close(done)
	wg.Wait()
	return msg, took
}

// AssertNoneWithin passes when nothing arrives in the window (what came
// before does not count), and fails as soon as a request arrives, listing
// it; AssertNoEventWithin only minds its event.
func TestAssertNoneWithin(t *testing.T) {
	t.Parallel()
	rec := NewReceiver(t)
	postEvent(t, rec, "before-1")
	rec.WaitEvent(t, "before-1")
	if msg := failure(t, func(tb testing.TB) { rec.AssertNoneWithin(tb, 100*time.Millisecond) }); msg != "" {
		t.Errorf("nothing arrived, yet AssertNoneWithin failed: %s", msg)
	}

	// Control: requests arrive during the window.
	const window = 10 * time.Second
	late := regexp.MustCompile(`^jetbridgetest: a request arrived at the receiver within 10s, where none should; [1-9][0-9]* requests so far:(\n  #[0-9]+ POST /x event="late-[0-9]+" attempt=0 signature=unchecked)+$`)
	msg, took := whileRunning(t, rec, func(i int) string { return fmt.Sprintf("late-%d", i) },
		func(tb testing.TB) { rec.AssertNoneWithin(tb, window) })
	if !late.MatchString(msg) {
		t.Errorf("AssertNoneWithin with requests arriving: %q, want a failure matching %s", msg, late)
	}
	if took >= window {
		t.Errorf("AssertNoneWithin failed after %s: it should fail when the request arrives", took)
	}

	// AssertNoEventWithin: other events may arrive...
	msg, _ = whileRunning(t, rec, func(i int) string { return fmt.Sprintf("other-%d", i) },
		func(tb testing.TB) { rec.AssertNoEventWithin(tb, "dup-1", 200*time.Millisecond) })
	if msg != "" {
		t.Errorf("AssertNoEventWithin failed on other events: %s", msg)
	}
	// ...and its own fails it (control).
	dup := regexp.MustCompile(`^jetbridgetest: a request for event dup-1 arrived at the receiver within 10s, where none should; [1-9][0-9]* requests so far:(\n  #[0-9]+ POST /x event="dup-1" attempt=0 signature=unchecked)+$`)
	msg, took = whileRunning(t, rec, func(int) string { return "dup-1" },
		func(tb testing.TB) { rec.AssertNoEventWithin(tb, "dup-1", window) })
	if !dup.MatchString(msg) || took >= window {
		t.Errorf("AssertNoEventWithin with its event arriving: %q after %s, want a failure matching %s", msg, took, dup)
	}
}

// The waits' timeout is the kit's Timeout unless an option or
// SetWaitTimeout says otherwise; a wait that runs out says which.
func TestWaitTimeoutOptions(t *testing.T) {
	t.Parallel()
	srv := NewServer(t)
	if d := NewReceiver(t).WaitTimeout(); d != Timeout {
		t.Errorf("default receiver wait timeout %s, want %s", d, Timeout)
	}
	rec := NewReceiver(t, WithWaitTimeout(100*time.Millisecond))
	b := StartBridge(t, srv, fmt.Sprintf(`
destinations: {receiver: {url: %s}}
routes: [{name: r, subjects: ["events.>"], destination: receiver}]
`, rec.URL()), WithBridgeWaitTimeout(150*time.Millisecond))

	start := time.Now()
	if msg := failure(t, func(tb testing.TB) { rec.WaitEvent(tb, "never") }); msg != "jetbridgetest: no request for event never at the receiver within 100ms; no requests yet" {
		t.Errorf("receiver: %q", msg)
	}
	if msg := failure(t, func(tb testing.TB) { b.WaitEvent(tb, "never") }); msg != "jetbridgetest: no final settlement of event never by the bridge within 150ms; no settlements yet" {
		t.Errorf("bridge: %q", msg)
	}
	if took := time.Since(start); took >= Timeout {
		t.Errorf("the two waits took %s", took)
	}
	rec.SetWaitTimeout(250 * time.Millisecond)
	b.SetWaitTimeout(0)
	if rec.WaitTimeout() != 250*time.Millisecond || b.WaitTimeout() != Timeout {
		t.Errorf("after SetWaitTimeout: receiver %s bridge %s", rec.WaitTimeout(), b.WaitTimeout())
	}
	if msg := failure(t, func(tb testing.TB) { rec.WaitCount(tb, 1) }); msg != "jetbridgetest: no 1 requests at the receiver within 250ms; no requests yet" {
		t.Errorf("receiver after SetWaitTimeout: %q", msg)
	}
}
