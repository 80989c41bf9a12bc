package bridge

import (
	"context"
	"io"
	"net/http"
	"time"
)

// This file is the life of one try's HTTP response: its request context
// outlives the try (the per-try timeout ends at the headers), and the
// attempt drains (bounded) and closes its body, then ends that context.

// response is what the pipeline keeps of an HTTP response. Its body is
// left open by the try and drained (bounded) or closed by the attempt,
// outside the per-try timeout, so that a slow body never turns a received
// status into a timeout.
type response struct {
	status     int
	retryAfter time.Duration
	body       io.ReadCloser
	length     int64              // Content-Length; -1 when unknown
	cancel     context.CancelFunc // ends the try's request context (tryContext)
	// drain bounds finish's drain: its attempt's timer (nil: one of its own).
	drain *cancelTimer
}

// newResponse keeps what the attempt needs of resp: the status, the
// Retry-After (read against resp's Date) and the open body with the
// release of its request context, in r (nil: a new one); drain is the
// timer that bounds its drain (nil: a timer of its own).
func newResponse(r *response, resp *http.Response, release context.CancelFunc, drain *cancelTimer, now time.Time) *response {
	if r == nil {
		r = new(response)
	}
	*r = response{
		status:     resp.StatusCode,
		retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), resp.Header.Get("Date"), now),
		body:       resp.Body,
		length:     resp.ContentLength,
		cancel:     release,
		drain:      drain,
	}
	return r
}

// tryContext is the request context of one try: the attempt's context
// (ctx), ended by the per-try timeout until headersIn is stopped. Once the
// headers are in, neither the timeout nor the try's return ends it: only
// release does (response.finish), after the body has been drained, so
// that the connection can be reused. headersIn.stop reports false when the
// timeout fired first (the request context has then ended).
//
// The per-try timeout is this context's, not a failsafe-go timeout
// policy's: that policy cancels its context as the try returns, and
// would need failsafe-go's internal DeferCancel to keep the body
// readable. headersIn is the attempt's timer, re-armed for each try
// (cancelTimer): no timer per try.
func tryContext(ctx context.Context, timeout time.Duration, headersIn *cancelTimer) (reqCtx context.Context, release context.CancelFunc) {
	reqCtx, release = context.WithCancel(ctx)
	headersIn.arm(timeout, release)
	return reqCtx, release
}

// cancelTimer calls one cancel function after a delay, re-armed for each
// try (and each drain) of an attempt instead of a timer made per try. Its
// lifetime is its attemptState's: only the attempt's goroutine arms and
// stops it, and every arm is ended by stop before the next. What it
// cancels is written only while it is disarmed (armed: before Reset, which
// the timer's run happens after); a timer whose stop came too late (it
// fired: its function may still be running, reading what it cancels) is
// never armed again: the next arm makes a new one.
type cancelTimer struct {
	cur   *armedCancel
	armed bool
}

// armedCancel is what one timer cancels; the timer's function reads it.
type armedCancel struct {
	t      *time.Timer
	cancel context.CancelFunc
}

func (c *armedCancel) fire() { c.cancel() }

// arm makes the timer call cancel after d, ending an arm not yet stopped.
func (ct *cancelTimer) arm(d time.Duration, cancel context.CancelFunc) {
	if ct.armed {
		ct.stop()
	}
	ct.armed = true
	if ct.cur == nil {
		c := &armedCancel{cancel: cancel}
		c.t = time.AfterFunc(d, c.fire)
		ct.cur = c
		return
	}
	ct.cur.cancel = cancel
	ct.cur.t.Reset(d)
}

// stop disarms the timer and reports whether it stopped it before it
// fired; a timer that fired is dropped (see cancelTimer). Stopping a timer
// that is not armed reports true.
func (ct *cancelTimer) stop() bool {
	if !ct.armed {
		return true
	}
	ct.armed = false
	if ct.cur.t.Stop() {
		ct.cur.cancel = nil // keeps no try's context
		return true
	}
	ct.cur = nil
	return false
}

// finish drains the body, when it is not known to be longer than
// maxResponseDrain, up to that size and within drainTimeout (so that the
// connection can be reused), and closes it, then ends the request
// context. A nil response, or one already finished, has nothing to
// finish.
func (r *response) finish() {
	if r == nil || r.body == nil {
		return
	}
	if r.length != 0 && r.length <= maxResponseDrain {
		drain := r.drain
		if drain == nil {
			drain = new(cancelTimer)
		}
		drain.arm(drainTimeout, r.cancel)
		_, _ = io.Copy(io.Discard, io.LimitReader(r.body, maxResponseDrain))
		drain.stop()
	}
	_ = r.body.Close()
	r.cancel()
	r.body = nil
}

// ok reports whether the response is a 2xx.
func (r *response) ok() bool { return r != nil && r.status >= 200 && r.status < 300 }

// pause is how long the response pauses its destination (back-pressure):
// the Retry-After of a 429 or 503, capped by maxPause; 0 for anything
// else.
func (r *response) pause(maxPause time.Duration) time.Duration {
	if r == nil || r.retryAfter <= 0 ||
		r.status != http.StatusTooManyRequests && r.status != http.StatusServiceUnavailable {
		return 0
	}
	return max(min(r.retryAfter, maxPause), 0)
}
