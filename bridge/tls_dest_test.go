package bridge

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// testPKI is a certificate authority made at test time, with a server
// certificate for 127.0.0.1 and a client certificate it signed. Every file
// is PEM in a t.TempDir().
type testPKI struct {
	caFile, certFile, keyFile string // CA; client certificate and key
	pool                      *x509.CertPool
	server                    tls.Certificate
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	dir := t.TempDir()
	ca := natstest.NewCA(t, dir, "ca")
	p := &testPKI{caFile: ca.File(), pool: ca.Pool()}
	srvCert, srvKey := ca.Issue(t, dir, "server", false)
	server, err := tls.LoadX509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	p.server = server
	p.certFile, p.keyFile = ca.Issue(t, dir, "client", true)
	return p
}

// tlsSink is an HTTPS destination on 127.0.0.1 serving the PKI's server
// certificate. It counts the requests its handler saw (a failed handshake
// never reaches it). With mutual TLS it requires a client certificate
// signed by the PKI's CA.
type tlsSink struct {
	srv     *httptest.Server
	handled atomic.Int64
}

func newTLSSink(t testing.TB, p *testPKI, mutual bool) *tlsSink {
	t.Helper()
	s := &tlsSink{}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.handled.Add(1)
		w.WriteHeader(http.StatusAccepted)
	}))
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are the point
	s.srv.TLS = &tls.Config{Certificates: []tls.Certificate{p.server}, MinVersion: tls.VersionTLS12}
	if mutual {
		s.srv.TLS.ClientAuth = tls.RequireAndVerifyClientCert
		s.srv.TLS.ClientCAs = p.pool
	}
	s.srv.StartTLS()
	t.Cleanup(s.srv.Close)
	return s
}

// tlsDestYAML is destination d at url with the given tls mapping, and
// route r with a short backoff.
const tlsDestYAML = `
destinations:
  d:
    url: %s/hook
    transport_retry: {count: 0}
    circuit_breaker: {enabled: false}
    tls: %s
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_deliver: 5, backoff: [50ms]}
`

// deliverOnce runs a bridge with the tls settings against sink, publishes
// one event and returns its first settlement.
func deliverOnce(t testing.TB, sink *tlsSink, tlsYAML string) (Settled, error) {
	h := startBridge(t, testConfig(t, tlsDestYAML, sink.srv.URL, tlsYAML), faults{})
	h.publish("events.info.tls", "e1", []byte(`{"n":1}`), nil)
	out := h.waitOutcomes(1, settleWait, nil)
	if len(out) == 0 {
		return Settled{}, errors.New("no settlement")
	}
	return out[0], nil
}

// refusedForTLS checks that the first try failed in TLS, as a transport
// error of the given kind, that the message is to be redelivered, and that
// the destination's handler saw nothing.
func refusedForTLS(t testing.TB, sink *tlsSink, tlsYAML, kind string) error {
	s, err := deliverOnce(t, sink, tlsYAML)
	if err != nil {
		return err
	}
	var te *TransportError
	switch {
	case s.Outcome != OutcomeRedeliveryScheduled:
		return fmt.Errorf("outcome %s (%v), want %s", s.Outcome, s.Err, OutcomeRedeliveryScheduled)
	case !errors.As(s.Err, &te) || te.Kind != kind:
		return fmt.Errorf("failure %v, want a TransportError of kind %q", s.Err, kind)
	case sink.handled.Load() != 0:
		return fmt.Errorf("the destination handled %d requests, want 0", sink.handled.Load())
	}
	return nil
}

// deliveredOverTLS checks that the first try was delivered, exactly once.
func deliveredOverTLS(t testing.TB, sink *tlsSink, tlsYAML string) error {
	s, err := deliverOnce(t, sink, tlsYAML)
	if err != nil {
		return err
	}
	if s.Outcome != OutcomeDelivered || s.Tries != 1 {
		return fmt.Errorf("outcome %s after %d tries (%v), want delivered after 1", s.Outcome, s.Tries, s.Err)
	}
	if n := sink.handled.Load(); n != 1 {
		return fmt.Errorf("the destination handled %d requests, want 1", n)
	}
	return nil
}

// HTTPS destinations, for real: a certificate from an unknown CA is
// refused unless the CA is configured (or verification is explicitly
// skipped), and a destination that requires a client certificate gets the
// request only when cert_file/key_file are set. A refused handshake
// reaches no handler and is a transport error: the message is redelivered.
func TestHTTPSDestination(t *testing.T) {
	p := newTestPKI(t)
	noTLS := "{}"
	withCA := fmt.Sprintf("{ca_file: %q}", p.caFile)
	withClientCert := fmt.Sprintf("{ca_file: %q, cert_file: %q, key_file: %q}", p.caFile, p.certFile, p.keyFile)
	insecure := "{insecure_skip_verify: true}"

	t.Run("unknown CA refused by default", func(t *testing.T) {
		if err := refusedForTLS(t, newTLSSink(t, p, false), noTLS, kindTLSUntrusted); err != nil {
			t.Fatal(err)
		}
		expectBroken(t, "verification skipped", func(t testing.TB) error {
			return refusedForTLS(t, newTLSSink(t, p, false), insecure, kindTLSUntrusted)
		})
	})
	t.Run("accepted with ca_file", func(t *testing.T) {
		if err := deliveredOverTLS(t, newTLSSink(t, p, false), withCA); err != nil {
			t.Fatal(err)
		}
		expectBroken(t, "no ca_file", func(t testing.TB) error {
			return deliveredOverTLS(t, newTLSSink(t, p, false), noTLS)
		})
	})
	t.Run("insecure_skip_verify delivers to an unknown CA", func(t *testing.T) {
		if err := deliveredOverTLS(t, newTLSSink(t, p, false), insecure); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("mutual TLS", func(t *testing.T) {
		if err := deliveredOverTLS(t, newTLSSink(t, p, true), withClientCert); err != nil {
			t.Fatalf("with a client certificate: %v", err)
		}
		if err := refusedForTLS(t, newTLSSink(t, p, true), withCA, kindTLSHandshake); err != nil {
			t.Fatalf("without a client certificate: %v", err)
		}
		expectBroken(t, "destination that does not require a client certificate", func(t testing.TB) error {
			return refusedForTLS(t, newTLSSink(t, p, false), withCA, kindTLSHandshake)
		})
	})
}
