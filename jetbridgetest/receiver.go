package jetbridgetest

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/webhook"
)

// Request headers the bridge sets on every delivery (docs/delivery.md#the-request).
const (
	HeaderEventID = "X-Event-Id"
	HeaderAttempt = "X-Delivery-Attempt"
)

// SignatureTolerance is how far a webhook-timestamp may be from the
// request's arrival for its signature to verify, as the Standard Webhooks
// specification recommends (and `bridge receive --secret` does).
const SignatureTolerance = webhook.Tolerance

// Errors of signature verification, in Request.SignatureErr: those of
// package webhook, which verifies.
var (
	ErrUnsigned          = webhook.ErrUnsigned
	ErrBadTimestamp      = webhook.ErrBadTimestamp
	ErrTimestampExpired  = webhook.ErrTimestampExpired
	ErrSignatureMismatch = webhook.ErrSignatureMismatch
)

// Request is one request as the receiver got it.
type Request struct {
	N      int // 1-based arrival number
	Method string
	Path   string
	Header http.Header
	Body   []byte
	At     time.Time // arrival, once the body was read
	// Verified: the receiver has secrets (WithSecret) and the Standard
	// Webhooks signature matches one of them.
	Verified bool
	// SignatureErr is why the signature did not verify; nil when it did
	// or when the receiver has no secrets. Match it with errors.Is against
	// ErrUnsigned, ErrBadTimestamp, ErrTimestampExpired, ErrSignatureMismatch.
	SignatureErr error
}

// EventID is the X-Event-Id header.
func (r Request) EventID() string { return r.Header.Get(HeaderEventID) }

// Attempt is the X-Delivery-Attempt header (the JetStream delivery count),
// 0 when absent or not a number.
func (r Request) Attempt() int {
	n, _ := strconv.Atoi(r.Header.Get(HeaderAttempt))
	return n
}

func (r Request) clone() Request {
	r.Header = r.Header.Clone()
	r.Body = slices.Clone(r.Body)
	return r
}

// Response tells the receiver how to answer one request. The zero value
// answers 200 with an empty body.
type Response struct {
	Status int         // 0 means 200
	Header http.Header // extra response headers
	Body   string
	// RetryAfter, if positive, sets Retry-After (whole seconds, rounded up).
	RetryAfter time.Duration
	// Delay waits before answering (latency). A client that gives up
	// first gets nothing.
	Delay time.Duration
	// Hang never answers: the request ends when the client gives up, or
	// with a dropped connection when the receiver closes.
	Hang bool
	// CloseConn closes the connection without any response (the client
	// sees a transport error).
	CloseConn bool
}

// Script decides the Response to each request. It is called once per
// request, one call at a time, in arrival order, so a stateful script needs
// no locking. It should return quickly: stall with Delay or Hang.
type Script func(Request) Response

// Always answers every request with status.
func Always(status int) Script { return func(Request) Response { return Response{Status: status} } }

// Sequence answers the i-th request it sees with statuses[i-1]; the last
// status repeats. With no statuses it answers 200.
func Sequence(statuses ...int) Script {
	next := sinktest.Sequence(statuses...)
	return func(Request) Response { return Response{Status: next(sinktest.Request{}).Status} }
}

// ByEvent answers by event id (X-Event-Id): attempt counts the requests
// with that id this script has seen, this one included (1-based), so
// ByEvent(func(id string, attempt int) Response {...}) scripts "fail the
// first try of e-3 with 503" per event.
func ByEvent(f func(eventID string, attempt int) Response) Script {
	var mu sync.Mutex // a Script value may serve more than one receiver
	attempts := map[string]int{}
	return func(r Request) Response {
		id := r.EventID()
		mu.Lock()
		attempts[id]++
		n := attempts[id]
		mu.Unlock()
		return f(id, n)
	}
}

// ReceiverOption configures NewReceiver.
type ReceiverOption func(*Receiver)

// WithScript answers by s instead of 200 to everything.
func WithScript(s Script) ReceiverOption { return func(r *Receiver) { r.script = s } }

// WithSecret verifies the Standard Webhooks signature of every request
// against these signing secrets (as in a destination's signing.secrets:
// "whsec_" and base64, or raw bytes). A request whose signature does not
// verify is recorded with its SignatureErr and answered 401 without
// calling the script, as a real receiver would refuse it.
func WithSecret(secrets ...string) ReceiverOption {
	return func(r *Receiver) { r.secrets = append(r.secrets, secrets...) }
}

// WithWaitTimeout makes the receiver's waits (WaitCount, WaitEvent) fail
// after d instead of Timeout: a test that expects its requests within a
// second fails in a second, not 20. d <= 0 means Timeout.
func WithWaitTimeout(d time.Duration) ReceiverOption {
	return func(r *Receiver) { r.timeout.set(d) }
}

// Receiver is a recording HTTP destination on 127.0.0.1, answering each
// request as its Script says; it is closed in t.Cleanup. Every request is
// recorded on arrival, before it is answered. It is safe for concurrent
// use.
type Receiver struct {
	sink    *sinktest.Sink
	secrets []string
	keys    [][]byte
	timeout *waitTimeout // of the waits: Timeout unless WithWaitTimeout or SetWaitTimeout
	reqs    *record[Request]

	mu     sync.Mutex
	script Script
}

// NewReceiver starts a receiver answering 200 (or as WithScript says);
// its waits fail after Timeout unless WithWaitTimeout says otherwise.
func NewReceiver(t testing.TB, opts ...ReceiverOption) *Receiver {
	t.Helper()
	r := &Receiver{reqs: newRecord(Request.clone), timeout: newWaitTimeout(Timeout)}
	for _, opt := range opts {
		opt(r)
	}
	if len(r.secrets) > 0 {
		secrets := make([]config.Secret, len(r.secrets))
		for i, s := range r.secrets {
			secrets[i] = config.Secret(s)
		}
		keys, err := (&config.Signing{Secrets: secrets}).Keys()
		if err != nil {
			t.Fatalf("jetbridgetest: WithSecret: %v", err)
		}
		r.keys = keys
	}
	r.sink = sinktest.New(t, r.serve)
	return r
}

// URL is the receiver's base URL, "http://127.0.0.1:PORT"; every path is
// served.
func (r *Receiver) URL() string { return r.sink.URL() }

// SetScript replaces the script for requests arriving from now on.
func (r *Receiver) SetScript(s Script) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.script = s
}

// Close stops the receiver: requests in Delay or Hang are cut off without
// an answer and new connections are refused. It runs in t.Cleanup; call it
// to take the destination down in the middle of a test.
func (r *Receiver) Close() { r.sink.Close() }

// Connections is the number of TCP connections the receiver accepted.
func (r *Receiver) Connections() int { return r.sink.Connections() }

// Requests returns a copy of every request so far, in arrival order.
func (r *Receiver) Requests() []Request { return r.reqs.all() }

// Count is the number of requests so far.
func (r *Receiver) Count() int { return r.reqs.len() }

// Events returns the requests carrying event id, in arrival order.
func (r *Receiver) Events(id string) []Request {
	return slices.DeleteFunc(r.Requests(), func(q Request) bool { return q.EventID() != id })
}

// WaitCount waits until at least n requests have arrived and returns all
// requests so far. After Timeout it fails the test, listing what arrived.
func (r *Receiver) WaitCount(t testing.TB, n int) []Request {
	t.Helper()
	return r.wait(t, fmt.Sprintf("%d requests at the receiver", n), func(reqs []Request) bool { return len(reqs) >= n })
}

// WaitEvent waits for the first request carrying event id (X-Event-Id) and
// returns it. After Timeout it fails the test, listing what arrived.
func (r *Receiver) WaitEvent(t testing.TB, id string) Request {
	t.Helper()
	is := func(q Request) bool { return q.EventID() == id }
	reqs := r.wait(t, "request for event "+id+" at the receiver", func(reqs []Request) bool { return slices.ContainsFunc(reqs, is) })
	return reqs[slices.IndexFunc(reqs, is)]
}

// SetWaitTimeout changes the timeout of the waits that start from now on
// (WithWaitTimeout); d <= 0 restores Timeout. WaitTimeout is the current
// one.
func (r *Receiver) SetWaitTimeout(d time.Duration) { r.timeout.set(d) }

// WaitTimeout is the timeout of the receiver's waits.
func (r *Receiver) WaitTimeout() time.Duration { return r.timeout.get() }

// AssertNoneWithin fails the test, listing what came, as soon as a request
// arrives within d from now; requests that arrived before the call do not
// count. It returns after d when none did: it always takes d, so keep d as
// short as the test allows (what must not be delivered at all, e.g. an
// event filtered out or a duplicate, is usually asserted after a later
// event that was delivered, with a short d).
func (r *Receiver) AssertNoneWithin(t testing.TB, d time.Duration) {
	t.Helper()
	r.reqs.none(t, d, "a request arrived at the receiver", func(Request) bool { return true }, describeRequests)
}

// AssertNoEventWithin is AssertNoneWithin for the requests carrying event
// id: other requests may arrive.
func (r *Receiver) AssertNoEventWithin(t testing.TB, id string, d time.Duration) {
	t.Helper()
	r.reqs.none(t, d, "a request for event "+id+" arrived at the receiver", func(q Request) bool { return q.EventID() == id }, describeRequests)
}

func (r *Receiver) wait(t testing.TB, what string, cond func([]Request) bool) []Request {
	t.Helper()
	return r.reqs.wait(t, r.timeout.get(), what, cond, describeRequests)
}

// describeRequests lists requests for a failure message: ids, attempts and
// signature results, never bodies.
func describeRequests(reqs []Request) string {
	return list(reqs, "requests", func(q Request) string {
		sig := "unchecked"
		switch {
		case q.Verified:
			sig = "valid"
		case q.SignatureErr != nil:
			sig = q.SignatureErr.Error()
		}
		return fmt.Sprintf("#%d %s %s event=%q attempt=%d signature=%s", q.N, q.Method, q.Path, q.EventID(), q.Attempt(), sig)
	})
}

// serve is the sink's script: it records the request, verifies it and
// asks the receiver's script. The sink calls it one request at a time.
func (r *Receiver) serve(sr sinktest.Request) sinktest.Response {
	q := Request{N: sr.N, Method: sr.Method, Path: sr.Path, Header: sr.Header, Body: sr.Body, At: sr.At}
	if r.keys != nil {
		q.SignatureErr = webhook.Verify(q.Header, q.Body, r.keys, q.At, SignatureTolerance)
		q.Verified = q.SignatureErr == nil
	}
	r.reqs.add(q)
	r.mu.Lock()
	script := r.script
	r.mu.Unlock()

	if q.SignatureErr != nil {
		return sinktest.Response{Status: http.StatusUnauthorized}
	}
	var resp Response
	if script != nil {
		resp = script(q)
	}
	h := resp.Header.Clone()
	if resp.RetryAfter > 0 {
		if h == nil {
			h = http.Header{}
		}
		secs := (resp.RetryAfter + time.Second - 1) / time.Second
		h.Set("Retry-After", strconv.FormatInt(int64(secs), 10))
	}
	return sinktest.Response{Status: resp.Status, Header: h, Body: resp.Body, Delay: resp.Delay, Hang: resp.Hang, CloseConn: resp.CloseConn}
}
