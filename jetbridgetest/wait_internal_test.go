package jetbridgetest

import (
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/producer"
)

// fatalTB records the message of a Fatalf instead of failing the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// failure runs fn with a fatalTB on its own goroutine and returns the
// message it failed with ("" if it did not fail).
func failure(t *testing.T, fn func(tb testing.TB)) string {
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); fn(f) }()
	<-done
	return f.msg
}

// A wait that runs out fails the test listing what arrived: ids, attempts
// and signature results (never bodies); a wait that is satisfied does not.
func TestWaitFailuresSayWhatArrived(t *testing.T) {
	t.Parallel()
	srv := NewServer(t)
	rec := NewReceiver(t, WithScript(Always(http.StatusAccepted)))
	b := StartBridge(t, srv, fmt.Sprintf(`
destinations: {receiver: {url: %s}}
routes: [{name: r, subjects: ["events.>"], destination: receiver}]
`, rec.URL()))
	srv.Publish(t, producer.Event{ID: "seen-1", Type: "t", Payload: []byte(`{"secret-body":1}`)})
	if msg := failure(t, func(tb testing.TB) { rec.WaitEvent(tb, "seen-1") }); msg != "" {
		t.Fatalf("a satisfied wait failed: %s", msg)
	}
	b.WaitEvent(t, "seen-1")

	rec.SetWaitTimeout(50 * time.Millisecond)
	b.SetWaitTimeout(50 * time.Millisecond)
	for name, fn := range map[string]func(testing.TB){
		"WaitCount":          func(tb testing.TB) { rec.WaitCount(tb, 2) },
		"Receiver.WaitEvent": func(tb testing.TB) { rec.WaitEvent(tb, "never") },
		"WaitSettled":        func(tb testing.TB) { b.WaitSettled(tb, 2) },
		"Bridge.WaitEvent":   func(tb testing.TB) { b.WaitEvent(tb, "never") },
		"WaitDeadLetters":    func(tb testing.TB) { b.WaitDeadLetters(tb, 1) },
	} {
		msg := failure(t, fn)
		if !strings.Contains(msg, `"seen-1"`) || strings.Contains(msg, "secret-body") {
			t.Errorf("%s failed with %q; want the event that arrived listed, without its body", name, msg)
		}
	}
}
