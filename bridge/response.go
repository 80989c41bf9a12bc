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
}

// newResponse keeps what the attempt needs of resp: the status, the
// Retry-After (read against resp's Date) and the open body with the
// release of its request context, in r (nil: a new one).
func newResponse(r *response, resp *http.Response, release context.CancelFunc, now time.Time) *response {
	if r == nil {
		r = new(response)
	}
	*r = response{
		status:     resp.StatusCode,
		retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), resp.Header.Get("Date"), now),
		body:       resp.Body,
		length:     resp.ContentLength,
		cancel:     release,
	}
	return r
}

// tryContext is the request context of one try: the attempt's context
// (ctx), ended by the per-try timeout until headersIn is stopped. Once the
// headers are in, neither the timeout nor the try's return ends it: only
// release does (response.finish), after the body has been drained, so
// that the connection can be reused. headersIn.Stop reports false when the
// timeout fired first (the request context has then ended).
//
// The per-try timeout is this context's, not a failsafe-go timeout
// policy's: that policy cancels its context as the try returns, and
// would need failsafe-go's internal DeferCancel to keep the body
// readable. headersIn is the timer itself (no method value per try).
func tryContext(ctx context.Context, timeout time.Duration) (reqCtx context.Context, headersIn *time.Timer, release context.CancelFunc) {
	reqCtx, release = context.WithCancel(ctx)
	return reqCtx, time.AfterFunc(timeout, release), release
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
		t := time.AfterFunc(drainTimeout, r.cancel)
		_, _ = io.Copy(io.Discard, io.LimitReader(r.body, maxResponseDrain))
		t.Stop()
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
