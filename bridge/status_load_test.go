package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// statusLoadRequests is how many /status requests the load test sends at
// once.
const statusLoadRequests = 40

// statusLoadCheck sends statusLoadRequests concurrent GET /status to base
// and counts, on a plain subscription of the test's own, the CONSUMER.INFO
// requests JetStream receives for the stream meanwhile. It fails when
// they exceed the bound: per route, one lookup per round of the readiness
// watch (rounds start at least statusMinInterval apart, plus one in flight
// at the start) and one of the route's watchdog. With fresh, every answer
// must carry consumer state looked up after the request was sent.
func statusLoadCheck(t testing.TB, h *harness, base string, fresh bool) error {
	nc, _ := natstest.Connect(t, h.srv.URL())
	sub, err := nc.SubscribeSync("$JS.API.CONSUMER.INFO." + h.cfg.Stream.Name + ".>")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range statusLoadRequests {
		wg.Go(func() {
			sent := time.Now()
			err := func() error {
				resp, err := http.Get(base + "/status")
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				var st struct {
					Routes []routeStatus `json:"routes"`
				}
				if err := json.Unmarshal(body, &st); err != nil || resp.StatusCode != 200 || len(st.Routes) != len(h.cfg.Routes) {
					return fmt.Errorf("/status: %d %v %s", resp.StatusCode, err, body)
				}
				for _, r := range st.Routes {
					if r.Error != "" {
						return fmt.Errorf("/status route %s: %s", r.Route, r.Error)
					}
					if fresh && (r.CheckedAt == nil || r.CheckedAt.Before(sent)) {
						return fmt.Errorf("/status route %s: state checked at %v, before the request (%v)", r.Route, r.CheckedAt, sent)
					}
				}
				return nil
			}()
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := nc.Flush(); err != nil { // every request JetStream got is in sub's queue now
		t.Fatal(err)
	}
	if len(errs) > 0 {
		t.Fatalf("%d of %d /status requests failed, first: %v", len(errs), statusLoadRequests, errs[0])
	}
	got, _, err := sub.Pending()
	if err != nil {
		t.Fatal(err)
	}
	routes := len(h.cfg.Routes)
	bound := routes*(int(elapsed/statusMinInterval)+2) + routes
	t.Logf("%d concurrent /status in %s: %d CONSUMER.INFO requests (bound %d)", statusLoadRequests, elapsed.Round(time.Millisecond), got, bound)
	if got > bound {
		return fmt.Errorf("%d concurrent /status made %d CONSUMER.INFO requests in %s, bound %d", statusLoadRequests, got, elapsed.Round(time.Millisecond), bound)
	}
	if fresh && got < routes {
		return fmt.Errorf("%d CONSUMER.INFO requests, want at least one per route (%d): the answers cannot be fresh", got, routes)
	}
	return nil
}

// Any number of concurrent /status requests cost JetStream a bounded
// number of consumer lookups (the readiness watch's, shared), and each
// answer is no older than its request; the lookup per route per request
// that /status used to make exceeds the bound.
func TestStatusBoundsConsumerLookups(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(200))
	cfg := testConfig(t, `
destinations:
  d: {url: %s}
routes:
  - {name: a, subjects: ["events.*.a.>"], destination: d}
  - {name: b, subjects: ["events.*.b.>"], destination: d}
  - {name: c, subjects: ["events.*.c.>"], destination: d}
`, sink.URL())
	h := startBridge(t, cfg, faults{})
	h.publish("events.info.a.x", "a1", []byte(`{}`), nil)
	h.waitOutcomes(1, settleWait, nil)
	admin := httptest.NewServer(h.b.AdminHandler(h.reg))
	t.Cleanup(admin.Close)
	if err := statusLoadCheck(t, h, admin.URL, true); err != nil {
		t.Fatal(err)
	}

	// Negative control: /status as it was, one consumer lookup per route
	// per request, served over the same kind of server.
	t.Run("negative control: a lookup per route per request", func(t *testing.T) {
		perRequest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
			defer cancel()
			out := make([]routeStatus, 0, len(h.b.routes))
			for _, rt := range h.b.routes {
				st := routeStatus{Route: rt.cfg.Name}
				if info, err := rt.consumer().Info(ctx); err != nil {
					st.Error = err.Error()
				} else {
					st.Pending = info.NumPending
				}
				out = append(out, st)
			}
			writeJSON(w, http.StatusOK, map[string]any{"routes": out})
		}))
		defer perRequest.Close()
		err := statusLoadCheck(t, h, perRequest.URL, false)
		if err == nil || !strings.Contains(err.Error(), "CONSUMER.INFO requests in") {
			t.Fatalf("the check passed against a lookup per route per request: %v", err)
		}
		t.Logf("caught, as it should: %v", err)
	})
}

// /status shows the readiness watch's lookup made after the request, with
// its time and age; once the watch has stopped (after Run), Status
// answers at once with the last lookup.
func TestStatusShowsCurrentConsumerState(t *testing.T) {
	sink := sinktest.New(t, sinktest.Always(200))
	cfg := testConfig(t, `
destinations:
  d: {url: %s}
routes:
  - {name: a, subjects: ["events.>"], destination: d}
`, sink.URL())
	h := startBridge(t, cfg, faults{})
	admin := httptest.NewServer(h.b.AdminHandler(h.reg))
	t.Cleanup(admin.Close)
	status := func() (routeStatus, error) {
		_, body := get(t, admin.URL+"/status")
		var st struct {
			Routes []routeStatus `json:"routes"`
		}
		if err := json.Unmarshal([]byte(body), &st); err != nil || len(st.Routes) != 1 {
			return routeStatus{}, fmt.Errorf("/status: %v %s", err, body)
		}
		return st.Routes[0], nil
	}
	before := time.Now()
	r, err := status()
	if err != nil {
		t.Fatal(err)
	}
	if r.Error != "" || r.CheckedAt == nil || r.CheckedAt.Before(before) || r.InfoAge == "" {
		t.Fatalf("/status route = %+v, want state checked after the request, with its age", r)
	}
	if _, err := time.ParseDuration(r.InfoAge); err != nil {
		t.Errorf("info_age %q: %v", r.InfoAge, err)
	}
	h.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan []routeStatus, 1)
	go func() { done <- h.b.routeStatuses(ctx) }()
	select {
	case got := <-done:
		if len(got) != 1 || got[0].CheckedAt == nil {
			t.Errorf("Status after Run = %+v, want the last lookup", got)
		}
	case <-ctx.Done():
		t.Fatal(errors.New("Status after Run waited for a round that never comes"))
	}
}
