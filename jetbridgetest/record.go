package jetbridgetest

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// record is an append-only list that tests can wait on: what a Receiver
// got, what a Bridge settled. It is safe for concurrent use.
type record[T any] struct {
	clone func(T) T // a deep copy, so callers never share an item

	mu      sync.Mutex
	items   []T
	changed chan struct{} // closed and replaced on every add
}

func newRecord[T any](clone func(T) T) *record[T] {
	return &record[T]{clone: clone, changed: make(chan struct{})}
}

func (r *record[T]) add(v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items = append(r.items, r.clone(v))
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *record[T]) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.items)
}

// all returns a copy of every item, in order.
func (r *record[T]) all() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]T, len(r.items))
	for i, v := range r.items {
		out[i] = r.clone(v)
	}
	return out
}

// wait blocks until cond holds for the items so far and returns a copy of
// them. After timeout it fails the test: "no <what> within <timeout>;
// <describe(items)>".
func (r *record[T]) wait(t testing.TB, timeout time.Duration, what string, cond func([]T) bool, describe func([]T) string) []T {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		r.mu.Lock()
		ok, changed := cond(r.items), r.changed
		r.mu.Unlock()
		if ok {
			return r.all()
		}
		select {
		case <-changed:
		case <-timer.C:
			t.Fatalf("jetbridgetest: no %s within %s; %s", what, timeout, describe(r.all()))
		}
	}
}

// none fails the test as soon as an item that match accepts is added
// within window from now (items added before the call do not count):
// "<what> within <window>, where none should; <describe(those items)>".
// It returns once window has passed without one.
func (r *record[T]) none(t testing.TB, window time.Duration, what string, match func(T) bool, describe func([]T) string) {
	t.Helper()
	r.mu.Lock()
	from := len(r.items)
	r.mu.Unlock()
	timer := time.NewTimer(window)
	defer timer.Stop()
	for {
		r.mu.Lock()
		var hits []T
		for _, v := range r.items[from:] {
			if match(v) {
				hits = append(hits, r.clone(v))
			}
		}
		changed := r.changed
		r.mu.Unlock()
		if len(hits) > 0 {
			t.Fatalf("jetbridgetest: %s within %s, where none should; %s", what, window, describe(hits))
			return
		}
		select {
		case <-changed:
		case <-timer.C:
			return
		}
	}
}

// waitTimeout is the timeout of a Receiver's or Bridge's waits, safe to
// change while another goroutine reads it.
type waitTimeout struct{ d atomic.Int64 }

func newWaitTimeout(d time.Duration) *waitTimeout {
	w := &waitTimeout{}
	w.set(d)
	return w
}

func (w *waitTimeout) get() time.Duration { return time.Duration(w.d.Load()) }

// set changes the timeout; d <= 0 restores Timeout.
func (w *waitTimeout) set(d time.Duration) {
	if d <= 0 {
		d = Timeout
	}
	w.d.Store(int64(d))
}

// maxListed bounds the items a failure message lists.
const maxListed = 20

// list describes items for a failure message: how many, then the last
// maxListed of them, one line each.
func list[T any](items []T, noun string, line func(T) string) string {
	if len(items) == 0 {
		return "no " + noun + " yet"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s so far:", len(items), noun)
	from := max(0, len(items)-maxListed)
	if from > 0 {
		fmt.Fprintf(&b, "\n  (%d earlier ones not listed)", from)
	}
	for _, v := range items[from:] {
		b.WriteString("\n  ")
		b.WriteString(line(v))
	}
	return b.String()
}
