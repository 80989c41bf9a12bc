package bridge

import (
	"sync"

	"golang.org/x/time/rate"
)

// logThrottle lets a log line through at most as often as its rate.Sometimes
// allows, and counts the lines it held back in between.
type logThrottle struct {
	mu   sync.Mutex
	s    rate.Sometimes
	held int // lines held back since the last one let through
}

// allow reports whether a line may be logged now and, when it may, how
// many were held back since the last one.
func (t *logThrottle) allow() (ok bool, heldBack int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.s.Do(func() { ok, heldBack, t.held = true, t.held, 0 })
	if !ok {
		t.held++
	}
	return ok, heldBack
}
