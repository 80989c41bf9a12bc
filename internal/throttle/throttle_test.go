package throttle

import (
	"slices"
	"testing"
	"time"
)

// A repeated error is let through at once, then once per interval, with
// its count and the occurrences not logged; another error or Reset starts
// again.
func TestLog(t *testing.T) {
	type line struct{ n, suppressed int }
	var logged []line
	log := func(n, suppressed int) { logged = append(logged, line{n, suppressed}) }
	var th Log // DefaultInterval: 30 s, longer than this test
	for range 9 {
		th.Do("x", log)
	}
	if !slices.Equal(logged, []line{{1, 0}}) {
		t.Errorf("logged %v within the interval, want only the 1st", logged)
	}
	logged = nil
	th.Do("y", log)
	th.Reset()
	th.Do("y", log)
	if !slices.Equal(logged, []line{{1, 0}, {1, 0}}) {
		t.Errorf("a new error and a reset start again: logged %v, want the 1st twice", logged)
	}
	// An interval that has always elapsed lets every occurrence through.
	short := Log{Interval: time.Nanosecond}
	logged = nil
	for range 3 {
		short.Do("x", log)
	}
	if !slices.Equal(logged, []line{{1, 0}, {2, 0}, {3, 0}}) {
		t.Errorf("with the interval elapsed: logged %v, want 1, 2, 3", logged)
	}
}
