package bridge

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// armer is what an attempt does with its cancelTimer.
type armer interface {
	arm(d time.Duration, cancel context.CancelFunc)
	stop() bool
}

// One cancelTimer re-armed for try after try (as an attempt's per-try
// timeout is): a try whose timeout fires has its own context cancelled
// and stop reports it; a try stopped in time keeps its context, even when
// a later try's timer fires. The control: a timer re-armed without
// taking the new try's cancel (it keeps the first try's) fails.
func TestCancelTimerCancelsTheArmedTryOnly(t *testing.T) {
	check := func(t testing.TB, ct armer) error {
		var kept []context.Context
		for i := range 20 {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if i%2 == 0 { // fires
				ct.arm(time.Millisecond, cancel)
				if !waitUntil(2*time.Second, func() bool { return ctx.Err() != nil }) {
					return fmt.Errorf("try %d: its timeout never ended its context", i)
				}
				if ct.stop() {
					return fmt.Errorf("try %d: stop reported in time after the timer fired", i)
				}
				continue
			}
			ct.arm(time.Hour, cancel)
			if !ct.stop() {
				return fmt.Errorf("try %d: stop reported fired for a timer of an hour", i)
			}
			kept = append(kept, ctx)
		}
		for i, ctx := range kept {
			if ctx.Err() != nil {
				return fmt.Errorf("try %d, stopped in time, was cancelled", 2*i+1)
			}
		}
		return nil
	}
	if err := check(t, new(cancelTimer)); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "a re-armed timer keeps the first try's cancel", func(t testing.TB) error {
		return check(t, &stickyTimer{})
	})
}

// stickyTimer is a broken cancelTimer: re-armed, it keeps cancelling what
// it was first armed with.
type stickyTimer struct {
	t      *time.Timer
	cancel context.CancelFunc
}

func (s *stickyTimer) arm(d time.Duration, cancel context.CancelFunc) {
	if s.t == nil {
		s.cancel = cancel
		s.t = time.AfterFunc(d, func() { s.cancel() })
		return
	}
	s.t.Reset(d)
}

func (s *stickyTimer) stop() bool { return s.t.Stop() }
