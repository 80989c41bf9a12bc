package bridge

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/subjects"
	"github.com/sotercare/jetbridge/webhook"
)

// signedDestination is a destination signing with two keys, never sent to.
func signedDestination(t testing.TB) *destination {
	t.Helper()
	cfg := testConfig(t, `
destinations:
  d:
    url: http://127.0.0.1:1/hooks
    headers: {X-Api-Key: configured-key}
    signing:
      secret: ["whsec_%s", "whsec_%s"]
routes:
  - {name: r, subjects: ["events.>"], destination: d}
`, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "c2VjcmV0LXR3by1zZWNyZXQtdHdvLXNlY3JldC10d28=")
	m, err := newMetrics(prometheus.NewRegistry(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, err := newDestination(cfg.Destinations["d"], zerolog.Nop(), nil, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.close)
	return d
}

// signedHeadersBefore is how a signed try's headers were made before the
// pooled signers: a clone of the payload's, the three headers Set, the
// signature from webhook.Sign. The request format is contract.
func signedHeadersBefore(p *payload, d *destination, now time.Time) http.Header {
	h := p.headers.Clone()
	ts := strconv.FormatInt(now.Unix(), 10)
	h.Set(webhook.HeaderID, p.id)
	h.Set(webhook.HeaderTimestamp, ts)
	h.Set(webhook.HeaderSignature, webhook.Sign(d.secrets, p.id, ts, p.body))
	return h
}

// Signed tries made concurrently (pooled signers, each used by one try at
// a time) from distinct payloads, several tries per payload with their own
// timestamps: every request carries exactly the headers and body of the
// way they were made before (byte for byte once written), verifies with
// the destination's keys, and the payload's shared headers never change.
// Every try's headers are checked again after the payload's later tries:
// a later try never writes into an earlier one's map. Run with -race. The
// control: tries that sign into the payload's shared map fail the check.
func TestSignedTriesExactAndIndependent(t *testing.T) {
	d := signedDestination(t)
	pipe := d.pipe.Load()
	type signFn func(p *payload, now time.Time) (*http.Request, error)
	check := func(t testing.TB, sign signFn, workers, perWorker int) error {
		errs := make(chan error, workers)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range perWorker {
					body := fmt.Sprintf(`{"worker":%d,"n":%d,"pad":"%s"}`, w, i, strings.Repeat("x", (w*31+i)%300))
					ev := &event{
						ID: fmt.Sprintf("e-%d-%d", w, i), Type: "reading", Severity: subjects.Info, Subject: "events.info.reading",
						Payload: []byte(body), ContentType: "application/json", Delivered: uint64(i%3 + 1), PublishedAt: time.Unix(1_800_000_000, int64(i)),
					}
					p, err := buildPayload(ev, d)
					if err != nil {
						errs <- err
						return
					}
					shared := maps.Clone(p.headers)
					var reqs []*http.Request
					var wants []http.Header
					var nows []time.Time
					for try := range 3 {
						now := time.Unix(1_800_000_000+int64(w*1000+i*3+try), 0)
						req, err := sign(p, now)
						if err != nil {
							errs <- err
							return
						}
						reqs, wants, nows = append(reqs, req), append(wants, signedHeadersBefore(p, d, now)), append(nows, now)
						got, err := io.ReadAll(req.Body)
						if err != nil || string(got) != string(p.body) {
							errs <- fmt.Errorf("%s try %d: body %q, want %q (%v)", ev.ID, try, got, p.body, err)
							return
						}
					}
					for try, req := range reqs {
						if err := sameWire(req.Header, wants[try]); err != nil {
							errs <- fmt.Errorf("%s try %d, after the later tries: %w", ev.ID, try, err)
							return
						}
						if err := webhook.Verify(req.Header, p.body, d.secrets, nows[try], webhook.Tolerance); err != nil {
							errs <- fmt.Errorf("%s try %d: %w", ev.ID, try, err)
							return
						}
					}
					if err := sameWire(p.headers, shared); err != nil {
						errs <- fmt.Errorf("%s: the payload's shared headers changed: %w", ev.ID, err)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		return <-errs
	}
	ctx := t.Context()
	prod := func(p *payload, now time.Time) (*http.Request, error) { return p.request(ctx, d, pipe, now) }
	if err := check(t, prod, 16, 40); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "each try signs into the payload's shared header map", func(t testing.TB) error {
		return check(t, func(p *payload, now time.Time) (*http.Request, error) {
			req, err := p.request(ctx, d, pipe, now)
			if err == nil {
				maps.Copy(p.headers, req.Header)
				req.Header = p.headers
			}
			return req, err
		}, 1, 4)
	})
}

// sameWire reports whether two headers write the same bytes on the wire.
func sameWire(got, want http.Header) error {
	var g, w strings.Builder
	if err := got.Write(&g); err != nil {
		return err
	}
	if err := want.Write(&w); err != nil {
		return err
	}
	if g.String() != w.String() {
		return fmt.Errorf("headers\n%s\nwant\n%s", g.String(), w.String())
	}
	return nil
}

// The allocations of one signed try's request, for the record
// (docs/performance.md): the pooled signer makes none of its own.
func BenchmarkSignedRequest(b *testing.B) {
	d := signedDestination(b)
	pipe := d.pipe.Load()
	p, err := buildPayload(&event{
		ID: "e-1", Type: "reading", Severity: subjects.Info, Subject: "events.info.reading",
		Payload: []byte(`{"n":1,"pad":"` + strings.Repeat("x", 1000) + `"}`), ContentType: "application/json", Delivered: 1, PublishedAt: time.Now(),
	}, d)
	if err != nil {
		b.Fatal(err)
	}
	ctx, now := context.Background(), time.Now()
	b.Run("before", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			req := d.reqTemplate.WithContext(ctx)
			req.Body, req.ContentLength = io.NopCloser(p.reader()), int64(len(p.body))
			req.Header = signedHeadersBefore(p, d, now)
		}
	})
	b.Run("now", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_, _ = p.request(ctx, d, pipe, now)
		}
	})
}
