package bridge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"github.com/failsafe-go/failsafe-go/timeout"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
)

// maxResponseDrain bounds how much of a response body is read (and thrown
// away) so that the connection can be reused. Bodies are never kept.
const maxResponseDrain = 64 << 10

// maxResponseHeaderBytes bounds the status line and header section of a
// destination's response (net/http's default is 10 MiB per response, per
// connection in flight). A response whose headers are longer is abandoned:
// the try is a TransportError of kind kindHeadersTooLarge, never a
// delivery. See the README's Security section.
const maxResponseHeaderBytes = 64 << 10

// maxRetryAfterLen bounds the Retry-After value that is parsed; a longer
// one is ignored (the longest valid HTTP-date is 29 bytes).
const maxRetryAfterLen = 64

// Transport error kinds that tests and operators match on.
const (
	kindHeadersTooLarge = "response headers too large"
	kindTLSUntrusted    = "tls certificate not trusted"
	kindTLSHandshake    = "tls handshake failed"
	kindHTTP2Protocol   = "http/2 protocol error"
)

// halfOpenPoll is how often a held message looks for a free half-open
// permit while probes are running.
const halfOpenPoll = 50 * time.Millisecond

// response is what the pipeline keeps of an HTTP response.
type response struct {
	status     int
	retryAfter time.Duration
}

// destination is one HTTP endpoint with its long-lived failsafe-go pipeline:
//
//	statusRetry(transportRetry(breaker(timeout(one HTTP try))))
//
// The timeout applies to each try. Every try passes the breaker, so every
// try counts in it. The two retry policies handle disjoint failures (no HTTP
// response; a listed status), so each keeps its own count across the
// attempt, and both abort at once when the breaker is open.
type destination struct {
	name   string
	url    string
	format string
	// baseHeader is the configured headers, canonical, without the
	// signature headers (only the bridge signs); nil when none.
	baseHeader http.Header
	secrets    [][]byte
	client     *http.Client
	breaker    circuitbreaker.CircuitBreaker[*response] // nil when disabled
	exec       failsafe.Executor[*response]
	// poolSize is the sum of max_in_flight of the routes using this
	// destination: the most requests it can have in flight at once.
	poolSize int
	changed  atomic.Pointer[chan struct{}] // closed and replaced on every breaker transition
	// breakerStatuses are the statuses the breaker counts as failures.
	breakerStatuses []int
	faults          faults
	m               *metrics
	log             zerolog.Logger

	// Transitions are reported (logged, counted, passed on) in chain order:
	// failsafe-go calls its listener outside its lock, so two transitions
	// racing on two goroutines can arrive swapped.
	transMu  sync.Mutex
	reported BreakerState      // the state the last reported transition led to
	early    [][2]BreakerState // transitions that arrived before their predecessor
}

// BreakerState is a destination's circuit state, as in the
// bridge_circuit_state metric: 0 closed, 1 half-open, 2 open.
type BreakerState int

// Breaker states.
const (
	BreakerClosed BreakerState = iota
	BreakerHalfOpen
	BreakerOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerHalfOpen:
		return "half-open"
	case BreakerOpen:
		return "open"
	}
	return "closed"
}

func breakerState(s circuitbreaker.State) BreakerState {
	switch s {
	case circuitbreaker.OpenState:
		return BreakerOpen
	case circuitbreaker.HalfOpenState:
		return BreakerHalfOpen
	}
	return BreakerClosed
}

func newDestination(cfg *config.Destination, log zerolog.Logger, onState func(dest string, from, to BreakerState), m *metrics, f faults) (*destination, error) {
	d := &destination{
		m:      m,
		faults: f,
		name:   cfg.Name,
		url:    cfg.URL.Value(),
		format: cfg.Format,
		log:    log.With().Str("destination", cfg.Name).Logger(),
	}
	ch := make(chan struct{})
	d.changed.Store(&ch)
	for k, v := range cfg.Headers {
		if d.baseHeader == nil {
			d.baseHeader = make(http.Header, len(cfg.Headers))
		}
		d.baseHeader.Set(k, v.Value())
	}
	for _, k := range []string{"Webhook-Id", "Webhook-Timestamp", "Webhook-Signature"} {
		d.baseHeader.Del(k) // only the bridge signs
	}
	if cfg.Signing != nil {
		keys, err := cfg.Signing.Keys()
		if err != nil {
			return nil, fmt.Errorf("bridge: destination %s: %w", cfg.Name, err)
		}
		d.secrets = keys
	}
	tlsConf, err := clientTLS(cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("bridge: destination %s: %w", cfg.Name, err)
	}
	d.client = &http.Client{
		Transport: destinationTransport(tlsConf, maxResponseHeaderBytes),
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse // a 3xx is an answer, never followed
		},
	}

	var policies []failsafe.Policy[*response]
	if sr := cfg.StatusRetry; sr != nil && sr.Count > 0 {
		maxWait := sr.MaxInterval.D()
		policies = append(policies, retrypolicy.NewBuilder[*response]().
			HandleIf(func(r *response, err error) bool {
				return err == nil && r != nil &&
					(slices.Contains(sr.Codes, r.status) || f.statusRetryAnyCode && r.status >= 500)
			}).
			// A Retry-After longer than we would sleep here is left to the
			// broker: the settlement honours it with NakWithDelay.
			AbortIf(func(r *response, err error) bool {
				return err == nil && r != nil && r.retryAfter > maxWait
			}).
			AbortOnErrors(circuitbreaker.ErrOpen, context.Canceled).
			WithMaxRetries(sr.Count).
			WithMaxDuration(sr.MaxElapsed.D()).
			WithBackoffFactor(sr.Interval.D(), sr.MaxInterval.D(), sr.BackoffFactor).
			WithDelayFunc(func(exec failsafe.ExecutionAttempt[*response]) time.Duration {
				if r := exec.LastResult(); r != nil && r.retryAfter > 0 {
					return r.retryAfter
				}
				return -1 // the backoff
			}).
			ReturnLastFailure().
			Build())
	}
	if tr := cfg.TransportRetry; tr.Count > 0 {
		policies = append(policies, retrypolicy.NewBuilder[*response]().
			HandleIf(func(r *response, err error) bool {
				if f.transportRetryOnlyOn5xx {
					return err == nil && r != nil && r.status >= 500
				}
				return isTransport(err) || f.transportRetryStatuses && err == nil && r != nil && r.status >= 500
			}).
			AbortOnErrors(circuitbreaker.ErrOpen, context.Canceled).
			WithMaxRetries(tr.Count).
			WithBackoffFactor(tr.Interval.D(), tr.MaxInterval.D(), tr.BackoffFactor).
			ReturnLastFailure().
			Build())
	}
	if cb := cfg.CircuitBreaker; cb.Enabled {
		d.breakerStatuses = cb.Statuses
		d.breaker = circuitbreaker.NewBuilder[*response]().
			HandleIf(func(r *response, err error) bool {
				if err != nil {
					return !errors.Is(err, context.Canceled) // shutdown is nobody's failure
				}
				return r != nil && slices.Contains(cb.Statuses, r.status) && !f.breakerIgnoresStatuses
			}).
			WithFailureRateThreshold(cb.FailureRate, uint(cb.MinRequests), cb.Window.D()).
			WithDelay(cb.Delay.D()).
			WithSuccessThreshold(uint(cb.SuccessThreshold)).
			OnStateChanged(func(e circuitbreaker.StateChangedEvent) {
				d.transition(breakerState(e.OldState), breakerState(e.NewState), onState)
				next := make(chan struct{})
				close(*d.changed.Swap(&next))
			}).
			Build()
		policies = append(policies, d.breaker)
	}
	policies = append(policies, timeout.New[*response](cfg.Timeout.D()))
	d.exec = failsafe.With(policies...)
	return d, nil
}

// transition reports from -> to once every transition before it has been
// reported, so that logs, the state gauge and OnBreaker always see a
// consistent chain closed -> open -> half-open -> ...
func (d *destination) transition(from, to BreakerState, onState func(dest string, from, to BreakerState)) {
	d.transMu.Lock()
	defer d.transMu.Unlock()
	d.early = append(d.early, [2]BreakerState{from, to})
	for {
		i := slices.IndexFunc(d.early, func(t [2]BreakerState) bool { return t[0] == d.reported })
		if i < 0 {
			if len(d.early) < 8 {
				return // wait for the missing predecessor
			}
			i = 0 // cannot happen; never let reports stall
		}
		t := d.early[i]
		d.early = slices.Delete(d.early, i, i+1)
		d.reported = t[1]
		d.log.Warn().Str("from", t[0].String()).Str("to", t[1].String()).Msg("circuit breaker state changed")
		if onState != nil {
			onState(d.name, t[0], t[1])
		}
	}
}

// destinationTransport builds the HTTP transport of one destination:
// no proxy (destinations come from the config only), its TLS settings, and
// at most maxHeaderBytes of response headers (0 would mean net/http's
// 10 MiB; production always passes maxResponseHeaderBytes).
func destinationTransport(tlsConf *tls.Config, maxHeaderBytes int64) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.TLSClientConfig = tlsConf
	tr.MaxIdleConnsPerHost = 64
	tr.MaxResponseHeaderBytes = maxHeaderBytes
	return tr
}

// sizePool keeps up to poolSize idle connections, so that every request
// the routes can have in flight finds a kept-alive connection: at a steady
// load the destination sees at most poolSize connections, never one per
// request (net/http's defaults keep 100 in all, closing the rest).
func (d *destination) sizePool() {
	tr, ok := d.client.Transport.(*http.Transport)
	if !ok || d.poolSize <= 0 {
		return
	}
	tr.MaxIdleConns = max(d.poolSize, 1)
	tr.MaxIdleConnsPerHost = max(d.poolSize, 1)
}

// isTransport reports whether err means no HTTP response was obtained.
func isTransport(err error) bool {
	var te *TransportError
	return errors.As(err, &te) || errors.Is(err, timeout.ErrExceeded)
}

// state is the breaker's current state (closed when disabled).
func (d *destination) state() BreakerState {
	if d.breaker == nil {
		return BreakerClosed
	}
	return breakerState(d.breaker.State())
}

// attempt makes one JetStream delivery's worth of HTTP tries: the first try
// plus the in-process retries. It returns the number of HTTP requests sent
// and nil for a 2xx, or the typed failure.
func (d *destination) attempt(ctx context.Context, p *payload) (tries int, err error) {
	probeFailed := false
	res, err := d.exec.WithContext(ctx).GetWithExecution(func(exec failsafe.Execution[*response]) (*response, error) {
		probe := d.breaker != nil && d.breaker.IsHalfOpen()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		tries++
		r, err := d.try(exec.Context(), p)
		if err != nil && ctx.Err() != nil { // shutdown, not a failure of the destination
			return nil, ctx.Err()
		}
		probeFailed = probe && (err != nil || exec.Context().Err() != nil || d.breakerCounts(r))
		return r, err
	})
	switch {
	case err == nil && res != nil && res.status >= 200 && res.status < 300:
		return tries, nil // a 2xx seen just as shutdown cut in still counts
	case ctx.Err() != nil:
		return tries, fmt.Errorf("%w: %w", ErrInterrupted, context.Cause(ctx))
	case errors.Is(err, circuitbreaker.ErrOpen):
		return tries, &CircuitOpenError{Destination: d.name, Remaining: d.breaker.RemainingDelay()}
	}
	failure := d.classify(res, err)
	if failure != nil && probeFailed {
		return tries, &CircuitOpenError{Destination: d.name, Err: failure}
	}
	return tries, failure
}

// breakerCounts reports whether the breaker counts r as a failure.
func (d *destination) breakerCounts(r *response) bool {
	return r != nil && slices.Contains(d.breakerStatuses, r.status)
}

func (d *destination) classify(res *response, err error) error {
	switch {
	case errors.Is(err, timeout.ErrExceeded):
		return &TransportError{Destination: d.name, Kind: "timeout", Err: err}
	case err != nil:
		return err
	case res == nil:
		return &TransportError{Destination: d.name, Kind: "no response"}
	case res.status >= 200 && res.status < 300:
		return nil
	}
	return &DownstreamError{Destination: d.name, Status: res.status, RetryAfter: res.retryAfter}
}

// try sends one HTTP request and reads at most maxResponseDrain bytes of
// the response body, which it discards.
func (d *destination) try(ctx context.Context, p *payload) (*response, error) {
	req, err := p.request(ctx, d, time.Now())
	if err != nil {
		return nil, &TransportError{Destination: d.name, Kind: "request cannot be built"}
	}
	start := time.Now()
	resp, err := d.client.Do(req)
	if err != nil {
		d.m.observeTry(d.name, 0, time.Since(start))
		return nil, transportError(d.name, err)
	}
	defer func() { d.m.observeTry(d.name, resp.StatusCode, time.Since(start)) }()
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseDrain))
	r := &response{status: resp.StatusCode}
	if !d.faults.retryAfterIgnored {
		r.retryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), resp.Header.Get("Date"), time.Now())
	}
	return r, nil
}

// transportError classifies a client error into a short kind. The *url.Error
// wrapper (whose text carries the URL and its query) is dropped.
func transportError(dest string, err error) *TransportError {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	kind := "connection failed"
	var (
		dnsErr  *net.DNSError
		certErr *tls.CertificateVerificationError
		uaErr   x509.UnknownAuthorityError
		hostErr x509.HostnameError
		recErr  tls.RecordHeaderError
	)
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), os.IsTimeout(err):
		kind = "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		kind = "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		kind = "connection reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		kind = "connection closed without a response"
	case errors.As(err, &dnsErr):
		kind = "name resolution failed"
	case errors.As(err, &certErr), errors.As(err, &uaErr), errors.As(err, &hostErr):
		kind = kindTLSUntrusted
	case errors.As(err, &recErr), isTLSAlert(err):
		kind = kindTLSHandshake
	case headersTooLarge(err):
		kind = kindHeadersTooLarge
	case strings.HasPrefix(err.Error(), "connection error: "):
		// net/http's HTTP/2 connection errors (untyped), e.g. a header
		// list far over the cap, which HTTP/2 cuts off this way.
		kind = kindHTTP2Protocol
	}
	return &TransportError{Destination: dest, Kind: kind, Err: err}
}

// headersTooLarge reports whether err is net/http refusing a response
// whose headers exceed the transport's MaxResponseHeaderBytes. net/http
// gives no typed error for it, so its messages are matched: HTTP/1
// ("server response headers exceeded N bytes") and HTTP/2 ("response
// header list larger than advertised limit").
func headersTooLarge(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "server response headers exceeded") ||
		strings.Contains(msg, "response header list larger than")
}

// isTLSAlert reports whether err is a TLS alert sent by the destination,
// such as "certificate required" when it wants a client certificate.
func isTLSAlert(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error"
}

// parseRetryAfter reads Retry-After as delay-seconds or an HTTP-date. A
// date is measured against the response's Date header when present, so a
// skewed destination clock does not distort it. Invalid or past values
// give 0.
func parseRetryAfter(v, date string, now time.Time) time.Duration {
	if v == "" || len(v) > maxRetryAfterLen {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		return time.Duration(min(secs, int64(365*24*3600))) * time.Second
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	if ref, err := http.ParseTime(date); err == nil {
		now = ref
	}
	return max(at.Sub(now), 0)
}

// waitUsable blocks while the breaker refuses every request: until its
// open delay has run out (the next request becomes a half-open probe), a
// transition, a half-open poll tick, or the end of ctx.
func (d *destination) waitUsable(ctx context.Context) error {
	for d.breaker != nil {
		changed := *d.changed.Load()
		var wait time.Duration
		switch d.state() {
		case BreakerClosed:
			return nil
		case BreakerOpen:
			if wait = d.breaker.RemainingDelay(); wait <= 0 {
				return nil
			}
		case BreakerHalfOpen:
			wait = halfOpenPoll
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-changed:
			t.Stop()
		case <-t.C:
			if d.state() == BreakerHalfOpen {
				return nil // a permit may be free
			}
		}
	}
	return nil
}

// clientTLS builds the TLS configuration of a destination.
func clientTLS(c config.TLS) (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.InsecureSkipVerify} //nolint:gosec // explicit opt-in
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls ca_file %s: no certificate found", c.CAFile)
		}
		conf.RootCAs = pool
	}
	if c.CertFile != "" || c.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls cert_file/key_file: %w", err)
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	return conf, nil
}
