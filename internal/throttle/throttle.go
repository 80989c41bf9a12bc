// Package throttle is the one log throttle of jetbridge: a repeated line
// is logged at its first occurrence and then at most once per interval
// (golang.org/x/time/rate.Sometimes), with the number of occurrences held
// back in between, so that no line is silently lost from the count.
package throttle

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// DefaultInterval is how often a Log with no Interval lets the same
// error through after its first occurrence.
const DefaultInterval = 30 * time.Second

// Log lets a repeated log line (an error on every reconnect attempt, a
// failed fetch, an ignored header) through at its first occurrence and then at most once per
// Interval (golang.org/x/time/rate.Sometimes), with the number of
// occurrences so far and of those not logged since the last line; a
// different error, or Reset, starts again. The zero value is ready and
// uses DefaultInterval.
type Log struct {
	Interval time.Duration

	mu      sync.Mutex
	last    string
	n, seen int // occurrences of last; n when log last ran
	s       *rate.Sometimes
}

// Do counts one occurrence of key and, if it is let through, calls log
// with n, the occurrences of key so far, and suppressed, those since the
// last call of log that were not let through.
func (t *Log) Do(key string, log func(n, suppressed int)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.s == nil || key != t.last {
		every := t.Interval
		if every <= 0 {
			every = DefaultInterval
		}
		t.last, t.n, t.seen, t.s = key, 0, 0, &rate.Sometimes{Interval: every}
	}
	t.n++
	t.s.Do(func() {
		log(t.n, t.n-t.seen-1)
		t.seen = t.n
	})
}

// Reset forgets the error and its count.
func (t *Log) Reset() {
	t.mu.Lock()
	t.last, t.n, t.seen, t.s = "", 0, 0, nil
	t.mu.Unlock()
}
