package bridge

import (
	"fmt"
	"testing"

	"golang.org/x/time/rate"
)

func TestLogThrottle(t *testing.T) {
	// Every third line: the throttle's own count of what it held back is
	// under test, rate.Sometimes's schedule is the library's.
	l := &logThrottle{s: rate.Sometimes{Every: 3}}
	var got []string
	for range 8 {
		ok, held := l.allow()
		got = append(got, fmt.Sprintf("%t/%d", ok, held))
	}
	if want := "[true/0 false/0 false/0 true/2 false/0 false/0 true/2 false/0]"; fmt.Sprint(got) != want {
		t.Errorf("allow = %v, want %s", got, want)
	}
}
