package config

import (
	"math"
	"reflect"
	"testing"
	"time"
)

func TestBackoffFor(t *testing.T) {
	r := &Route{Backoff: []Duration{Duration(time.Second), Duration(5 * time.Second), Duration(30 * time.Second)}}
	tests := []struct {
		delivered int
		want      time.Duration
	}{
		{0, time.Second},
		{1, time.Second},
		{2, 5 * time.Second},
		{3, 30 * time.Second},
		{4, 30 * time.Second},
		{100, 30 * time.Second},
	}
	for _, tt := range tests {
		if got := r.BackoffFor(tt.delivered); got != tt.want {
			t.Errorf("BackoffFor(%d) = %s, want %s", tt.delivered, got, tt.want)
		}
	}
	if got := (&Route{}).BackoffFor(1); got != 0 {
		t.Errorf("empty backoff: %s, want 0", got)
	}
}

func TestBackoffDelay(t *testing.T) {
	b := &Backoff{Count: 5, Interval: Duration(50 * time.Millisecond), BackoffFactor: 2, MaxInterval: Duration(300 * time.Millisecond)}
	tests := []struct {
		n    int
		want time.Duration
	}{
		{1, 50 * time.Millisecond},
		{2, 100 * time.Millisecond},
		{3, 200 * time.Millisecond},
		{4, 300 * time.Millisecond},
		{1000, 300 * time.Millisecond},
		{0, 50 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := b.Delay(tt.n); got != tt.want {
			t.Errorf("Delay(%d) = %s, want %s", tt.n, got, tt.want)
		}
	}
	flat := &Backoff{Interval: Duration(time.Second), BackoffFactor: 1, MaxInterval: Duration(time.Second)}
	if got := flat.Delay(7); got != time.Second {
		t.Errorf("factor 1: Delay(7) = %s, want 1s", got)
	}
	uncapped := &Backoff{Interval: Duration(time.Second), BackoffFactor: 10}
	if got := uncapped.Delay(1000); got != math.MaxInt64 {
		t.Errorf("uncapped overflow: Delay(1000) = %s, want the maximum duration", got)
	}
	sr := &StatusRetry{Backoff: *b}
	if got := sr.Delay(2); got != 100*time.Millisecond {
		t.Errorf("StatusRetry.Delay(2) = %s", got)
	}
}

func TestDestinationNamesAndEmbedded(t *testing.T) {
	c := &Config{Destinations: map[string]*Destination{"b": {}, "c": {}, "a": {}}}
	if got := c.DestinationNames(); !reflect.DeepEqual(got, []string{"a", "b", "c"}) {
		t.Errorf("DestinationNames() = %q", got)
	}
	if !c.Embedded() {
		t.Error("Embedded() = false without a URL")
	}
	c.NATS.URL = "nats://127.0.0.1:4222"
	if c.Embedded() {
		t.Error("Embedded() = true with a URL")
	}
}
