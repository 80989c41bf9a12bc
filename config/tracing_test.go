package config

import (
	"strings"
	"testing"
)

// The tracing block: off by default, an http(s) endpoint, a bad one named
// by key and line without quoting it.
func TestTracingBlock(t *testing.T) {
	cfg, err := Load([]byte(minimal), "t.yaml")
	if err != nil || cfg.Tracing.Endpoint != "" || cfg.Tracing.EventID {
		t.Fatalf("default: %+v %v", cfg.Tracing, err)
	}
	cfg, err = Load([]byte(minimal+"tracing: {endpoint: \"http://collector:4318\", event_id: true}\n"), "t.yaml")
	if err != nil || cfg.Tracing.Endpoint.Value() != "http://collector:4318" || !cfg.Tracing.EventID {
		t.Fatalf("set: %+v %v", cfg.Tracing, err)
	}
	_, err = Load([]byte(minimal+"tracing: {endpoint: \"ftp://user:SECRET@collector\"}\n"), "t.yaml")
	if err == nil || !strings.Contains(err.Error(), "tracing.endpoint") || strings.Contains(err.Error(), "SECRET") {
		t.Fatalf("bad endpoint: %v", err)
	}
}
