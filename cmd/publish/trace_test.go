package main

import "testing"

// TRACEPARENT in the environment puts the published event in that trace
// (docs/tracing.md); a malformed one is not forwarded.
func TestPublishTraceparentFromEnvironment(t *testing.T) {
	s := startStream(t)
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	t.Setenv("TRACEPARENT", parent)
	mustPublish(t, "", "--url", s.url, "--type", "order.created", "--id", "t-1", `{}`)
	if got := s.get(t, 1).Header.Get("traceparent"); got != parent {
		t.Fatalf("stored traceparent %q, want %q", got, parent)
	}
	t.Setenv("TRACEPARENT", parent+"-extra")
	mustPublish(t, "", "--url", s.url, "--type", "order.created", "--id", "t-2", `{}`)
	if h := s.get(t, 2).Header; h.Get("traceparent") != "" {
		t.Fatalf("malformed TRACEPARENT forwarded: %v", h)
	}
}
