package config

import (
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
