package bridge

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/buildinfo"
)

// routeStatus is one route as /status shows it.
type routeStatus struct {
	Route       string `json:"route"`
	Destination string `json:"destination"`
	Pending     uint64 `json:"pending"`     // not yet delivered to any replica
	AckPending  int    `json:"ack_pending"` // delivered, not yet settled (all replicas)
	Redelivered int    `json:"redelivered"` // ack pending after more than one delivery
	InFlight    int64  `json:"in_flight"`   // being processed by this bridge
	Breaker     string `json:"breaker"`     // closed, half-open or open
	Delivering  bool   `json:"delivering"`  // false: nothing is pulled (Options.NoDelivery, or paused)
	Paused      bool   `json:"paused"`      // paused: true in the configuration: nothing is pulled
	// CheckedAt is when the consumer's state (pending, ack pending,
	// redelivered) was looked up, InfoAge how long before the answer.
	CheckedAt *time.Time `json:"checked_at,omitempty"`
	InfoAge   string     `json:"info_age,omitempty"`
	Error     string     `json:"error,omitempty"`
	// Ordering is an ordered route's partitions and keys in this replica
	// (ordered_route.go); the consumer fields are then empty.
	Ordering *OrderingStatus `json:"ordering,omitempty"`
}

// destinationStatus is one destination as /status shows it: its breaker
// and its flow control (docs/delivery.md#flow-control).
type destinationStatus struct {
	Destination string `json:"destination"`
	Breaker     string `json:"breaker"`
	Held        int64  `json:"held"` // messages held by the open breaker
	RateLimit   string `json:"rate_limit,omitempty"`
	// FleetRate is the rate limit's share of the fleet (fleet.go); nil
	// without a rate limit.
	FleetRate *FleetRateStatus `json:"fleet_rate,omitempty"`
	GateStatus
}

// destinationStatuses is every destination's state, sorted by name.
func (b *Bridge) destinationStatuses() []destinationStatus {
	b.mu.RLock()
	defer b.mu.RUnlock()
	out := make([]destinationStatus, 0, len(b.dests))
	for _, name := range b.applied.DestinationNames() {
		d := b.dests[name]
		st := destinationStatus{Destination: name, Breaker: d.state().String(), Held: d.held.Load(), GateStatus: d.gate.Status()}
		if rl := d.cfg.RateLimit; rl != nil {
			st.RateLimit = fmt.Sprintf("%d per %s, burst %d", rl.Requests, rl.Per, rl.Burst)
		}
		if p := d.pipe.Load(); p != nil && p.rate != nil {
			if fr, ok := p.rate.src.(*fleetRate); ok {
				fs := fr.status()
				st.FleetRate = &fs
			}
		}
		out = append(out, st)
	}
	return out
}

// routeStatuses is every route's consumer state and this bridge's own. The
// consumer state comes from the readiness watch's lookups, never from a
// lookup of its own: routeStatuses waits (until ctx ends) for a round of the
// watch that started after the call, which concurrent calls share, so
// /status costs JetStream at most one lookup per route per
// statusMinInterval however often it is requested. CheckedAt and InfoAge
// say how old each route's state is (older when NATS cannot be reached).
func (b *Bridge) routeStatuses(ctx context.Context) []routeStatus {
	b.health.fresh(ctx)
	now := time.Now()
	routes := b.liveRoutes()
	out := make([]routeStatus, 0, len(routes))
	for _, r := range routes {
		st := routeStatus{Route: r.cfg.Name, Destination: r.dest.name, InFlight: r.load.inFlight.Load(), Breaker: r.dest.state().String(), Paused: r.cfg.Paused,
			Delivering: !b.opts.NoDelivery && !r.cfg.Paused}
		info, at, lastErr := b.health.lastLookup(r)
		if r.ord != nil {
			st.Ordering = r.ord.status() // pending and ack pending sum its partitions
		}
		switch {
		case r.ord == nil && r.consumer() == nil:
			st.Error = "consumer not bound yet"
		case r.bound.missing.Load():
			st.Error = "consumer deleted; restart the bridge to create it again"
		case lastErr != "":
			st.Error = "consumer lookup failed: " + lastErr
		case info == nil:
			st.Error = "consumer not looked up yet"
		}
		if info != nil {
			st.Pending, st.AckPending, st.Redelivered = info.NumPending, info.NumAckPending, info.NumRedelivered
			st.CheckedAt, st.InfoAge = &at, now.Sub(at).Round(time.Millisecond).String()
		}
		out = append(out, st)
	}
	return out
}

// AdminHandler serves /healthz (200 while the process runs and its NATS
// connection is not closed for good, else 503), /readyz (200 when ready,
// else 503 with a JSON reason), /status (JSON, per route) and /metrics
// (Prometheus, from g).
func (b *Bridge) AdminHandler(g prometheus.Gatherer) http.Handler {
	return b.adminHandler(g, b.Healthy, b.Readiness)
}

// adminHandler is AdminHandler with its health and readiness checks as
// parameters.
func (b *Bridge) adminHandler(g prometheus.Gatherer, healthy, ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := healthy(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unhealthy", "reason": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		state := "ready"
		if err := ready(); err != nil {
			state = err.Error()
		}
		out := map[string]any{"ready": state, "build": buildinfo.Read(), "routes": b.routeStatuses(ctx), "destinations": b.destinationStatuses()}
		if cs := b.confStatus.Load(); cs != nil {
			out["config"] = cs
		}
		writeJSON(w, http.StatusOK, out)
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

// RequireToken guards h with a bearer token (admin.token): every request
// but GET /healthz and /readyz, which probes make without credentials,
// needs "Authorization: Bearer <token>", else it is answered 401 with
// "WWW-Authenticate: Bearer" and a short JSON body. Anything not listed as
// open needs the token, unknown paths included. The comparison takes the
// same time whatever the token sent (both sides are hashed first, so not
// even the length shows). An empty token guards nothing: h is returned.
func RequireToken(token config.Secret, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	want := sha256.Sum256([]byte(token.Value()))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || bearerMatches(r.Header.Get("Authorization"), &want) {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", "Bearer")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, unauthorizedBody)
	})
}

// unauthorizedBody is the body of a refused request.
const unauthorizedBody = `{"status":"unauthorized","reason":"missing or wrong bearer token: send Authorization: Bearer followed by admin.token"}` + "\n"

// bearerMatches reports, in constant time, whether the Authorization
// header value carries the bearer token whose SHA-256 is want (the scheme
// is case-insensitive, RFC 9110 11.1).
func bearerMatches(header string, want *[sha256.Size]byte) bool {
	scheme, tok, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}
