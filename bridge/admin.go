package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// RouteStatus is one route as /status shows it.
type RouteStatus struct {
	Route       string `json:"route"`
	Destination string `json:"destination"`
	Pending     uint64 `json:"pending"`     // not yet delivered to any replica
	AckPending  int    `json:"ack_pending"` // delivered, not yet settled (all replicas)
	Redelivered int    `json:"redelivered"` // ack pending after more than one delivery
	InFlight    int64  `json:"in_flight"`   // being processed by this bridge
	Breaker     string `json:"breaker"`     // closed, half-open or open
	Error       string `json:"error,omitempty"`
}

// Status reads every route's consumer and this bridge's own state.
func (b *Bridge) Status(ctx context.Context) []RouteStatus {
	out := make([]RouteStatus, 0, len(b.routes))
	for _, r := range b.routes {
		st := RouteStatus{Route: r.cfg.Name, Destination: r.dest.name, InFlight: r.inFlight.Load(), Breaker: r.dest.state().String()}
		if c := r.consumer(); c == nil {
			st.Error = "consumer not bound yet"
		} else if info, err := c.Info(ctx); err != nil {
			st.Error = err.Error()
		} else {
			st.Pending, st.AckPending, st.Redelivered = info.NumPending, info.NumAckPending, info.NumRedelivered
		}
		out = append(out, st)
	}
	return out
}

// Readiness returns nil once the bridge is connected and every route's
// consumer is bound, else the reason it is not ready.
func (b *Bridge) Readiness() error {
	select {
	case <-b.ready:
	default:
		if err := b.provisionErr.Load(); err != nil {
			return errors.New("provisioning: " + (*err).Error())
		}
		return errors.New("starting: streams and consumers not provisioned yet")
	}
	if nc := b.js.Conn(); nc != nil && !nc.IsConnected() {
		return errors.New("disconnected from NATS: " + nc.Status().String())
	}
	for _, r := range b.routes {
		if r.missing.Load() {
			return errors.New("route " + r.cfg.Name + ": consumer deleted; restart the bridge to create it again")
		}
	}
	return nil
}

// AdminHandler serves /healthz (200 while the process runs), /readyz (200
// when ready, else 503 with a JSON reason), /status (JSON, per route) and
// /metrics (Prometheus, from g).
func (b *Bridge) AdminHandler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := b.Readiness(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		ready := "ready"
		if err := b.Readiness(); err != nil {
			ready = err.Error()
		}
		writeJSON(w, http.StatusOK, map[string]any{"ready": ready, "routes": b.Status(ctx)})
	})
	if g != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	}
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
