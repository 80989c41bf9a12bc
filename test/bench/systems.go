package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// system is one system under test: the real bridge binary with one route,
// the naive reference bridge, or the Watermill peer.
type system struct {
	naive       bool
	watermill   bool   // the Watermill peer (test/bench/watermill); no other field applies
	envelope    bool   // naive bridge: -envelope (the bridge's JSON envelope)
	confirm     bool   // naive bridge: -confirm (DoubleAck)
	async       bool   // naive bridge with confirm: -async (confirmations collected on one subscription)
	kv          bool   // naive bridge: -kv (the idempotency's two KV writes)
	fat         bool   // naive bridge: run from the build that links the bridge's dependencies (fat.go)
	baseline    bool   // jetbridge: the -baseline binary instead of this build
	inFlight    int    // max_in_flight, or K for the naive bridge
	format      string // envelope (default) or raw
	idempotency bool
	noBreaker   bool
	backoff     string // YAML flow list, "" for the default
	maxDeliver  int    // 0 for the default
	messages    int    // backlog of this system in drain runs; 0: the scenario's
	concurrency int    // the destination's concurrency.max; 0: no flow control
	// Issue 28 (issue28.go). keys: drain runs publish the backlog
	// round-robin over this many subjects events.info.k<i> (0: the one
	// subject events.info.bench). ordered: jetbridge's route has an
	// ordering block keyed on the subject's third token (default
	// partitions). rateLimit: the destination has a fleet rate limit
	// never reached (fleetRateYAML). sinkDelay: the sink answers each
	// request after this long.
	keys      int
	ordered   bool
	filter    string // the route's subjects; "": events.>
	rateLimit bool
	sinkDelay time.Duration
}

func (s system) label() string {
	if s.watermill {
		return fmt.Sprintf("Watermill bridge, %d queue subscriptions", watermillSubscribers)
	}
	if s.naive {
		name := "naive"
		if s.envelope {
			name += " + envelope"
		}
		if s.confirm && s.async {
			name += " + confirmed ack (async)"
		} else if s.confirm {
			name += " + confirmed ack"
		}
		if s.kv {
			name += " + 2 KV writes"
		}
		if s.fat {
			name += ", linked with the bridge's dependencies"
		}
		return fmt.Sprintf("%s, K=%d", name, s.inFlight)
	}
	name := "jetbridge"
	if s.baseline {
		name = "jetbridge (baseline build)"
	}
	parts := []string{name, orDefault(s.format, "envelope"), "max_in_flight " + strconv.Itoa(s.inFlight)}
	if s.idempotency {
		parts = append(parts, "idempotency on")
	}
	if s.noBreaker {
		parts = append(parts, "breaker off")
	}
	if s.backoff != "" {
		parts = append(parts, "backoff "+s.backoff)
	}
	if s.concurrency > 0 {
		parts = append(parts, "concurrency "+strconv.Itoa(s.concurrency))
	}
	if s.ordered {
		parts = append(parts, "ordered (key: token 3, 16 partitions)")
	}
	if s.filter != "" {
		parts = append(parts, "subjects "+s.filter)
	}
	if s.rateLimit {
		parts = append(parts, "fleet rate_limit "+fleetRateYAML+" (never reached)")
	}
	if s.keys > 0 {
		parts = append(parts, keysLabel(s.keys))
	}
	if s.sinkDelay > 0 {
		parts = append(parts, "sink +"+s.sinkDelay.String())
	}
	if s.messages > 0 {
		parts = append(parts, fmt.Sprintf("%dk backlog", s.messages/1000))
	}
	return strings.Join(parts, ", ")
}

// orDefault is v, or def when v is empty.
func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// breakerDelay is the circuit breaker's default delay
// (docs/configuration.md): the bridge's configs here never change it.
const breakerDelay = 2 * time.Second

// bridgeConfig is the YAML configuration of the bridge for sys: defaults
// everywhere except the NATS URL, the admin address, the destination and
// the route's knobs of sys.
func bridgeConfig(sys system, natsURL, adminAddr, destURL, route string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "nats:\n  url: %q\n", natsURL)
	fmt.Fprintf(&b, "admin:\n  listen: %q\n", adminAddr)
	b.WriteString("log:\n  level: info\n  format: json\n")
	b.WriteString("shutdown_timeout: 5s\n")
	fmt.Fprintf(&b, "destinations:\n  sink:\n    url: %q\n    format: %s\n", destURL, orDefault(sys.format, "envelope"))
	if sys.noBreaker {
		b.WriteString("    circuit_breaker:\n      enabled: false\n")
	}
	if sys.concurrency > 0 {
		fmt.Fprintf(&b, "    concurrency: {max: %d}\n", sys.concurrency)
	}
	if sys.rateLimit {
		fmt.Fprintf(&b, "    rate_limit: %s\n", fleetRateYAML)
	}
	fmt.Fprintf(&b, "routes:\n  - name: %s\n    subjects: [%q]\n    destination: sink\n", route, orDefault(sys.filter, "events.>"))
	fmt.Fprintf(&b, "    max_in_flight: %d\n    idempotency: %t\n", sys.inFlight, sys.idempotency)
	if sys.backoff != "" {
		fmt.Fprintf(&b, "    backoff: %s\n", sys.backoff)
	}
	if sys.maxDeliver > 0 {
		fmt.Fprintf(&b, "    max_deliver: %d\n", sys.maxDeliver)
	}
	if sys.ordered {
		fmt.Fprintf(&b, "    ordering:\n      key: {tokens: [%d]}\n", keyToken)
	}
	return b.String()
}

// watermillSubscribers is the Watermill peer's concurrency, fixed in
// its configuration (test/bench/watermill/main.go).
const watermillSubscribers = 64

// sut is a running system under test.
type sut struct {
	*child
	admin   string // jetbridge's admin address; "" for the others
	metrics string // the URL of its allocation counters (allocs.go)
	lane    int    // the sink lane it delivers to (sink.go)
}

// startSystem starts sys against the server at natsURL. The bridge is
// started from the binary built for this benchmark, with a config file in
// dir; the naive bridge is this binary in its "_naive" role. It does not
// wait for the bridge to be ready: drain runs time from the first request.
func (e *env) startSystem(ctx context.Context, sys system, natsURL, dir string) (*sut, error) {
	return e.startSystemOn(ctx, sys, natsURL, dir, 0)
}

// startSystemOn starts sys delivering to the sink's lane (0 or 1), with a
// durable consumer of its own: two systems started on two lanes consume
// every message each.
func (e *env) startSystemOn(ctx context.Context, sys system, natsURL, dir string, lane int) (*sut, error) {
	dest := e.sink.destOf(lane)
	metricsAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	metricsURL := "http://" + metricsAddr + "/metrics"
	if sys.watermill {
		args := []string{"-nats", natsURL, "-url", dest, "-subject", "events.>",
			"-durable", fmt.Sprintf("watermill%d", lane), "-metrics", metricsAddr}
		c, _, err := startChild(ctx, dir, "watermill", e.watermillBin, args, nil)
		if err != nil {
			return nil, err
		}
		return &sut{child: c, metrics: metricsURL, lane: lane}, nil
	}
	if sys.naive {
		args := []string{"_naive", "-nats", natsURL, "-url", dest, "-k", strconv.Itoa(sys.inFlight), "-stream", streamName,
			"-durable", fmt.Sprintf("naive%d", lane), "-metrics", metricsAddr}
		if sys.envelope {
			args = append(args, "-envelope")
		}
		if sys.confirm {
			args = append(args, "-confirm")
		}
		if sys.async {
			args = append(args, "-async")
		}
		if sys.kv {
			args = append(args, "-kv")
		}
		bin := e.self
		if sys.fat {
			bin = e.fatSelf
			args = append(args, "-fat")
		}
		c, _, err := startChild(ctx, dir, "naive", bin, args, nil)
		if err != nil {
			return nil, err
		}
		return &sut{child: c, metrics: metricsURL, lane: lane}, nil
	}
	admin, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "bridge.yaml")
	if err := os.WriteFile(cfgPath, []byte(bridgeConfig(sys, natsURL, admin, dest, fmt.Sprintf("bench%d", lane))), 0o600); err != nil {
		return nil, err
	}
	bin := e.bridgeBin
	if sys.baseline {
		bin = e.baselineBin
	}
	c, err := startBridge(ctx, dir, bin, cfgPath)
	if err != nil {
		return nil, err
	}
	// The bridge's admin /metrics: its Go collector exports the counters.
	return &sut{child: c, admin: admin, metrics: "http://" + admin + "/metrics", lane: lane}, nil
}

// startBridge starts the bridge binary ("bridge run"). It prints no ready
// line: the caller waits on its admin endpoint.
func startBridge(ctx context.Context, dir, bin, cfgPath string) (*child, error) {
	c, _, err := startChildWith(ctx, dir, "bridge", bin, []string{"run", "--config", cfgPath}, nil, false)
	return c, err
}

// status is the part of the bridge's GET /status the benchmark reads.
type status struct {
	Routes []struct {
		Breaker string `json:"breaker"`
	} `json:"routes"`
}

// waitBreaker waits until the bridge's /status answers and, unless want is
// "", its route's breaker is in state want.
func (s *sut) waitBreaker(ctx context.Context, want string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: time.Second}
	last := "no answer"
	for {
		if err := s.exited(); err != nil {
			return err
		}
		if got, err := s.breaker(ctx, hc); err != nil {
			last = err.Error()
		} else if want == "" || got == want {
			return nil
		} else {
			last = "breaker " + got
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bridge /status: want breaker %q within %s, last: %s%s", want, timeout, last, s.logTail())
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

func (s *sut) breaker(ctx context.Context, hc *http.Client) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.admin+"/status", nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("/status %d", resp.StatusCode)
	}
	var st status
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&st); err != nil {
		return "", err
	}
	if len(st.Routes) != 1 {
		return "", fmt.Errorf("/status lists %d routes, want 1", len(st.Routes))
	}
	return st.Routes[0].Breaker, nil
}

// freeAddr is a free loopback address for the bridge's admin listener.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
