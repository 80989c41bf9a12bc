package config

import (
	"strings"
	"testing"
)

// destinations.*.forward_baggage: absent means false (a producer's W3C
// baggage never reaches the destination); true opts in, per destination;
// a value that is not a boolean is an error naming the key.
func TestForwardBaggage(t *testing.T) {
	const yml = `destinations:
  plain:
    url: http://127.0.0.1:9091/plain
  opted:
    url: http://127.0.0.1:9091/opted
    forward_baggage: true
routes:
  - {name: r, subjects: ["events.>"], destination: plain}
`
	c, err := Load([]byte(yml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Destinations["plain"].ForwardBaggage {
		t.Error("forward_baggage defaults to true, want false")
	}
	if !c.Destinations["opted"].ForwardBaggage {
		t.Error("forward_baggage: true was not read")
	}
	_, err = Load([]byte(strings.Replace(yml, "forward_baggage: true", "forward_baggage: sometimes", 1)), "test.yaml")
	if err == nil || !strings.Contains(err.Error(), "forward_baggage") {
		t.Errorf("forward_baggage: sometimes: error %v, want one naming the key", err)
	}
}
