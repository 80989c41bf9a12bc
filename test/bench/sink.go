package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxSinkIDs bounds the id table a reset may ask for.
const maxSinkIDs = 10_000_000

// maxBody bounds a request body the sink reads.
const maxBody = 1 << 20

// sinkStats is what the sink's control endpoint GET /stats answers.
type sinkStats struct {
	Requests  int64 `json:"requests"`    // requests answered since the reset
	Unique    int   `json:"unique"`      // distinct sequence numbers seen
	Dups      int   `json:"dups"`        // requests for a sequence already seen
	Invalid   int   `json:"invalid"`     // bodies without a sequence in range
	FirstNS   int64 `json:"first_ns"`    // first request, ns since the reset (0: none)
	LastNewNS int64 `json:"last_new_ns"` // last new sequence, ns since the reset
	Conns     int64 `json:"conns"`       // TCP connections accepted since the reset
	MaxOpen   int64 `json:"max_open"`    // most connections open at once since the reset
	// Latency percentiles (publish to arrival, ns) of the sequences at or
	// above the reset's lat_from, first arrival only.
	Latencies int   `json:"latencies"`
	P50NS     int64 `json:"p50_ns"`
	P99NS     int64 `json:"p99_ns"`
	P999NS    int64 `json:"p999_ns"`
}

// sink is the HTTP destination: it answers every request with the status
// set by the last reset and records each sequence number it sees, per
// lane: requests to the destination URL go to lane 0, requests to it with
// "/b" appended to lane 1 (two systems measured at once, each delivering
// every message).
type sink struct {
	conns, open, maxOpen atomic.Int64

	mu      sync.Mutex
	status  int
	delay   time.Duration // added before each answer (the onekey scenario)
	latFrom int
	since   time.Time
	lanes   [2]lane
}

// lane is what the sink recorded of one system's requests.
type lane struct {
	seen      []bool
	st        sinkStats
	latencies []int64
}

// runSink is the "_sink" role. It serves the destination and the control
// endpoints on two random loopback ports, prints "ready <dest> <control>"
// and serves until SIGTERM.
func runSink(ctx context.Context, args []string) error {
	if len(args) != 0 {
		return fmt.Errorf("_sink takes no arguments")
	}
	s := &sink{status: http.StatusAccepted, since: time.Now()}
	dest := &http.Server{
		Handler:           http.HandlerFunc(s.serveEvent),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ConnState:         s.connState,
	}
	ctl := &http.Server{Handler: s.controlHandler(), ReadHeaderTimeout: 10 * time.Second}
	var lc net.ListenConfig
	dl, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	cl, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		dl.Close()
		return err
	}
	errc := make(chan error, 2)
	go func() { errc <- dest.Serve(dl) }()
	go func() { errc <- ctl.Serve(cl) }()
	fmt.Println("ready", dl.Addr(), cl.Addr())
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = dest.Shutdown(sctx)
	_ = ctl.Shutdown(sctx)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func (s *sink) connState(_ net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		s.conns.Add(1)
		n := s.open.Add(1)
		for {
			m := s.maxOpen.Load()
			if n <= m || s.maxOpen.CompareAndSwap(m, n) {
				break
			}
		}
	case http.StateClosed, http.StateHijacked:
		s.open.Add(-1)
	}
}

func (s *sink) serveEvent(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	now := time.Now()
	seq, okSeq := markedInt(body, seqMarker)
	ts, okTS := markedInt(body, tsMarker)
	s.mu.Lock()
	l := &s.lanes[0]
	if strings.HasSuffix(r.URL.Path, "/b") {
		l = &s.lanes[1]
	}
	l.st.Requests++
	elapsed := now.Sub(s.since).Nanoseconds()
	if l.st.FirstNS == 0 {
		l.st.FirstNS = max(elapsed, 1)
	}
	switch {
	case err != nil || !okSeq || seq >= int64(len(l.seen)):
		l.st.Invalid++
	case l.seen[seq]:
		l.st.Dups++
	default:
		l.seen[seq] = true
		l.st.Unique++
		l.st.LastNewNS = elapsed
		if okTS && int(seq) >= s.latFrom && len(l.latencies) < cap(l.latencies) {
			l.latencies = append(l.latencies, now.UnixNano()-ts)
		}
	}
	status, delay := s.status, s.delay
	s.mu.Unlock()
	if delay > 0 {
		// A destination's fixed latency, outside the lock: requests in
		// flight wait it concurrently.
		time.Sleep(delay)
	}
	w.WriteHeader(status)
}

// maxSinkDelay bounds the latency a reset may add to each answer.
const maxSinkDelay = time.Second

// controlHandler serves POST /reset?n=N&status=S&lat_from=L&delay_us=D
// (forget everything, expect sequences 0..N-1 in each lane, answer S after
// D µs (0 when absent), record latencies of sequences >= L) and GET /stats (lane 0; ?lane=1 for lane 1;
// ?latency=1 adds the percentiles).
func (s *sink) controlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /reset", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		n, err1 := strconv.Atoi(q.Get("n"))
		status, err2 := strconv.Atoi(q.Get("status"))
		latFrom, err3 := strconv.Atoi(q.Get("lat_from"))
		delayUS, err4 := 0, error(nil)
		if d := q.Get("delay_us"); d != "" {
			delayUS, err4 = strconv.Atoi(d)
		}
		if err := errors.Join(err1, err2, err3, err4); err != nil || n < 0 || n > maxSinkIDs || status < 200 || status > 599 ||
			delayUS < 0 || delayUS > int(maxSinkDelay/time.Microsecond) {
			http.Error(w, "reset wants n in [0,10000000], status in [200,599], lat_from and delay_us in [0,1000000]", http.StatusBadRequest)
			return
		}
		delay := time.Duration(delayUS) * time.Microsecond
		s.mu.Lock()
		s.status, s.delay, s.latFrom, s.since = status, delay, latFrom, time.Now()
		for i := range s.lanes {
			s.lanes[i] = lane{seen: make([]bool, n), latencies: make([]int64, 0, max(n-latFrom, 0))}
		}
		s.conns.Store(0)
		s.maxOpen.Store(s.open.Load())
		s.mu.Unlock()
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		withLat := r.URL.Query().Get("latency") == "1"
		i := 0
		if r.URL.Query().Get("lane") == "1" {
			i = 1
		}
		var lat []int64
		s.mu.Lock()
		st := s.lanes[i].st
		if withLat {
			lat = slices.Clone(s.lanes[i].latencies)
		}
		s.mu.Unlock()
		st.Conns, st.MaxOpen = s.conns.Load(), s.maxOpen.Load()
		if withLat {
			slices.Sort(lat)
			st.Latencies = len(lat)
			st.P50NS, st.P99NS, st.P999NS = quantile(lat, 0.50), quantile(lat, 0.99), quantile(lat, 0.999)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
	return mux
}

// quantile is the nearest-rank q-quantile of sorted values (0 if empty).
func quantile(sorted []int64, q float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// sinkClient talks to the sink's control endpoints.
type sinkClient struct {
	dest string // the destination URL the systems under test POST to
	ctl  string // base URL of the control endpoints
	hc   *http.Client
}

func newSinkClient(destAddr, ctlAddr string) *sinkClient {
	return &sinkClient{
		dest: "http://" + destAddr + "/events",
		ctl:  "http://" + ctlAddr,
		hc:   &http.Client{Timeout: 10 * time.Second},
	}
}

func (c *sinkClient) reset(ctx context.Context, n, status, latFrom int) error {
	return c.resetDelayed(ctx, n, status, latFrom, 0)
}

// resetDelayed is reset with every answer delayed by delay (a
// destination's fixed latency).
func (c *sinkClient) resetDelayed(ctx context.Context, n, status, latFrom int, delay time.Duration) error {
	q := url.Values{"n": {strconv.Itoa(n)}, "status": {strconv.Itoa(status)}, "lat_from": {strconv.Itoa(latFrom)},
		"delay_us": {strconv.FormatInt(delay.Microseconds(), 10)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.ctl+"/reset?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("sink reset: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("sink reset: status %d", resp.StatusCode)
	}
	return nil
}

// destOf is the destination URL of lane (0 or 1).
func (c *sinkClient) destOf(lane int) string {
	if lane == 1 {
		return c.dest + "/b"
	}
	return c.dest
}

// stats reads lane 0's counters.
func (c *sinkClient) stats(ctx context.Context, latency bool) (sinkStats, error) {
	return c.statsOf(ctx, 0, latency)
}

// statsOf reads the counters of lane (0 or 1).
func (c *sinkClient) statsOf(ctx context.Context, lane int, latency bool) (sinkStats, error) {
	var st sinkStats
	u := fmt.Sprintf("%s/stats?lane=%d", c.ctl, lane)
	if latency {
		u += "&latency=1"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return st, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return st, fmt.Errorf("sink stats: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("sink stats: status %d", resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&st); err != nil {
		return st, fmt.Errorf("sink stats: %w", err)
	}
	return st, nil
}
