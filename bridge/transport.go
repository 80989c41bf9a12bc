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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sotercare/jetbridge/config"
)

// This file holds what a destination's HTTP transport is made of: the
// connection pool, TLS, the bounds on what a response may make the bridge
// read, and the classification of a try that got no response.

// maxResponseDrain bounds the response body the bridge reads (and throws
// away) so that the connection can be reused: a body not known to be
// longer is drained up to this size, after the attempt and within
// drainTimeout. Bodies are never kept, and a body never changes the try's
// outcome.
const maxResponseDrain = 16 << 10

// drainTimeout bounds the drain of one response body; a body that takes
// longer is abandoned with its connection.
const drainTimeout = 100 * time.Millisecond

// maxResponseHeaderBytes bounds the status line and header section of a
// destination's response (net/http's default is 10 MiB per response, per
// connection in flight). A response whose headers are longer is abandoned:
// the try is a TransportError of kind kindHeadersTooLarge, never a
// delivery. See docs/security.md.
const maxResponseHeaderBytes = 64 << 10

// maxRetryAfterLen bounds the Retry-After value that is parsed; a longer
// one is ignored (the longest valid HTTP-date is 29 bytes).
const maxRetryAfterLen = 64

// Transport error kinds that tests and operators match on (the cause of a
// TransportError, in logs and in Bridge-Error).
const (
	kindTimeout            = "timeout"
	kindRefused            = "connection refused"
	kindReset              = "connection reset"
	kindClosed             = "connection closed without a response"
	kindDNS                = "name resolution failed"
	kindConnectionFailed   = "connection failed"
	kindHeadersTooLarge    = "response headers too large"
	kindTLSUntrusted       = "tls certificate not trusted"
	kindTLSHandshake       = "tls handshake failed"
	kindHTTP2Protocol      = "http/2 protocol error"
	kindRequestUnbuildable = "request cannot be built"
)

// destinationTransport builds the HTTP transport of one destination:
// no proxy (destinations come from the config only), its TLS settings, and
// at most maxHeaderBytes of response headers (0 would mean net/http's
// 10 MiB; production always passes maxResponseHeaderBytes). It asks for no
// compressed response: the bridge never reads a response body (it drains
// it, up to maxResponseDrain), so net/http's transparent gzip would only
// add a header to every request (a header map and two allocations per
// try) and a decompression to every drain.
func destinationTransport(tlsConf *tls.Config, maxHeaderBytes int64) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.TLSClientConfig = tlsConf
	tr.MaxIdleConnsPerHost = 64
	tr.MaxResponseHeaderBytes = maxHeaderBytes
	tr.DisableCompression = true
	return tr
}

// sizePool keeps up to poolSize idle connections, so that every request
// the routes can have in flight finds a kept-alive connection (net/http's
// defaults keep 100 in all, closing the rest), and caps the connections at
// poolSize: the routes never have more requests in flight than that, and
// without the cap net/http dials a new connection for a request that
// finds none idle even when one is about to be released, then keeps both
// (a drain at max_in_flight 1024 opened 1,051).
func (d *destination) sizePool() {
	d.gate.full = d.poolSize // the slow-start ramp's target without a concurrency limit
	tr, ok := d.pipe.Load().transport.(*http.Transport)
	if d.poolSize <= 0 || !ok {
		return
	}
	tr.MaxIdleConns = max(d.poolSize, 1)
	tr.MaxIdleConnsPerHost = max(d.poolSize, 1)
	tr.MaxConnsPerHost = max(d.poolSize, 1)
}

// isTransport reports whether err means no HTTP response was obtained.
func isTransport(err error) bool {
	if err == nil {
		return false // without the pointer below escaping for every success
	}
	var te *TransportError
	return errors.As(err, &te)
}

// transportError classifies a client error into a short kind. The *url.Error
// wrapper (whose text carries the URL and its query) is dropped.
func transportError(dest string, err error) *TransportError {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	kind := kindConnectionFailed
	var (
		dnsErr  *net.DNSError
		certErr *tls.CertificateVerificationError
		uaErr   x509.UnknownAuthorityError
		hostErr x509.HostnameError
		recErr  tls.RecordHeaderError
	)
	switch {
	case errors.Is(err, errTryTimeout), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), os.IsTimeout(err):
		kind = kindTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		kind = kindRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		kind = kindReset
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		kind = kindClosed
	case errors.As(err, &dnsErr):
		kind = kindDNS
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
