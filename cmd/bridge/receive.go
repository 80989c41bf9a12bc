package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sotercare/jetbridge/config"
)

// signatureTolerance is how far webhook-timestamp may be from now.
const signatureTolerance = 5 * time.Minute

func cmdReceive(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("receive", stderr)
	listen := fs.String("listen", "127.0.0.1:9090", "address to listen on")
	status := fs.Int("status", http.StatusAccepted, "status to answer")
	failRate := fs.Float64("fail-rate", 0, "share of requests (0..1) answered 503 instead")
	secret := fs.String("secret", "", "Standard Webhooks signing secret (whsec_...): verify signatures")
	verbose := fs.Bool("verbose", false, "also print every header and the body")
	delay := fs.Duration("delay", 0, "wait this long before answering each request (a slow destination)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usageErr("receive takes no arguments, got %q", pos[0])
	case *status < 100 || *status > 599:
		return usageErr("--status %d: not an HTTP status", *status)
	case *failRate < 0 || *failRate > 1:
		return usageErr("--fail-rate %g: want a share between 0 and 1", *failRate)
	}
	rc := &receiver{status: *status, failRate: *failRate, verbose: *verbose, delay: *delay, out: stdout}
	if *secret != "" {
		keys, err := (&config.Signing{Secrets: []config.Secret{config.Secret(*secret)}}).Keys()
		if err != nil {
			return usageErr("--secret: %v", err)
		}
		rc.keys = keys
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Handler: rc, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "receiving on http://%s/ (answering %d, failing %.0f%% with 503%s); Ctrl-C to stop\n",
		ln.Addr(), *status, *failRate*100, map[bool]string{true: ", verifying signatures"}[rc.keys != nil])
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-errc
	fmt.Fprintf(stdout, "received %d requests\n", rc.count.Load())
	return nil
}

// receiver is the deliberately unreliable webhook receiver of `bridge
// receive`: one line per delivery, a chosen status, a share of 503s.
type receiver struct {
	status   int
	failRate float64
	keys     [][]byte
	verbose  bool
	delay    time.Duration
	count    atomic.Int64
	mu       sync.Mutex // serialises output lines
	out      io.Writer
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 10<<20))
	if err != nil {
		http.Error(w, "cannot read body", http.StatusBadRequest)
		return
	}
	n := rc.count.Add(1)
	status := rc.status
	if rc.failRate > 0 && rand.Float64() < rc.failRate {
		status = http.StatusServiceUnavailable
	}
	sig := "unsigned"
	if rc.keys != nil {
		sig = "ok"
		if err := verifySignature(r.Header, body, rc.keys, time.Now()); err != nil {
			sig = "INVALID (" + err.Error() + ")"
			status = http.StatusUnauthorized
		}
	} else if r.Header.Get("webhook-signature") != "" {
		sig = "not checked (no --secret)"
	}
	if rc.delay > 0 {
		select {
		case <-time.After(rc.delay):
		case <-r.Context().Done():
			return // the client gave up
		}
	}
	w.WriteHeader(status)

	rc.mu.Lock()
	defer rc.mu.Unlock()
	fmt.Fprintf(rc.out, "%s #%d %d %s %s id=%s type=%s severity=%s attempt=%s signature=%s\n",
		time.Now().Format("15:04:05.000"), n, status, r.Method, r.URL.Path,
		orDash(r.Header.Get("X-Event-Id")), orDash(r.Header.Get("X-Event-Type")),
		orDash(r.Header.Get("X-Event-Severity")), orDash(r.Header.Get("X-Delivery-Attempt")), sig)
	if rc.verbose {
		names := make([]string, 0, len(r.Header))
		for k := range r.Header {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			fmt.Fprintf(rc.out, "    %s: %s\n", k, strings.Join(r.Header[k], ", "))
		}
		fmt.Fprintf(rc.out, "    body: %s\n", body)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// verifySignature checks a Standard Webhooks v1 signature: HMAC-SHA256 over
// id.timestamp.body with any of the keys, a timestamp within tolerance.
func verifySignature(h http.Header, body []byte, keys [][]byte, now time.Time) error {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("missing webhook headers")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("bad timestamp")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > signatureTolerance || d < -signatureTolerance {
		return errors.New("timestamp outside tolerance")
	}
	for _, key := range keys {
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id + "." + ts + "."))
		mac.Write(body)
		want := mac.Sum(nil)
		for _, s := range strings.Fields(sigs) {
			b64, ok := strings.CutPrefix(s, "v1,")
			if !ok {
				continue
			}
			if got, err := base64.StdEncoding.DecodeString(b64); err == nil && hmac.Equal(got, want) {
				return nil
			}
		}
	}
	return errors.New("no signature matches")
}
