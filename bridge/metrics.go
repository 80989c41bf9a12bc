package bridge

import (
	"maps"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/throttle"
)

// HTTP request classes of bridge_http_requests_total.
const (
	classTransport = "transport"
)

// metrics are the Prometheus series listed in docs/operating.md#metrics. Their labels carry only
// names from the configuration, outcomes, classes and reasons: never an
// event id, a payload or a header value.
type metrics struct {
	messages    *prometheus.CounterVec   // route, outcome
	requests    *prometheus.CounterVec   // destination, class
	duration    *prometheus.HistogramVec // destination
	circuit     *prometheus.GaugeVec     // destination
	inFlight    *prometheus.GaugeVec     // route
	deadLetters *prometheus.CounterVec   // route, reason
	// payloadOmitted counts dead letters stored without their payload.
	payloadOmitted *prometheus.CounterVec // route
	// safetyNet counts MAX_DELIVERIES advisories given up as permanent
	// failures (see safetynet.go).
	safetyNet *prometheus.CounterVec // reason

	// Flow control (flow.go), by destination.
	concurrencyLimit *prometheus.GaugeVec   // destination
	gateInFlight     *prometheus.GaugeVec   // destination
	waiting          *prometheus.GaugeVec   // destination, severity
	rateLimitedSecs  *prometheus.CounterVec // destination
	pausedSecs       *prometheus.CounterVec // destination
	fleetWaitSecs    *prometheus.CounterVec // destination
	fleetErrors      *prometheus.CounterVec // destination, op
	budgetRefusals   *prometheus.CounterVec // destination

	// Stream and store state, from the readiness checks' lookups (every
	// readinessEvery, whatever the scrapes): never a request per scrape.
	consumerPending   *prometheus.GaugeVec   // route
	deadLettersStored prometheus.Gauge       // the dead-letter stream's messages
	idempotencyErrors *prometheus.CounterVec // route
	// idempotencyConflicts counts event-id conflicts found (idempotency.go).
	idempotencyConflicts *prometheus.CounterVec // route, part

	// severityMismatch counts Event-Severity headers ignored because the
	// subject's severity token disagreed (event.go).
	severityMismatch *prometheus.CounterVec // route

	// ordered are the ordered routes' series (ordered_route.go).
	ordered *orderingMetrics

	// children are the series of the hot path, looked up once rather than
	// per message. A value is never changed: a reload that adds a route or
	// a destination stores a copy with them (addNames), so the hot path
	// reads them with one atomic load, no lock.
	children atomic.Pointer[hotChildren]
}

// hotChildren are the hot path's series by route and destination name.
type hotChildren struct {
	settled  map[string]map[Outcome]prometheus.Counter // route -> outcome
	dest     map[string]*destMetrics
	severity map[string]*severityMismatches // each route's child and log throttle
}

// severityMismatches is one route's ignored Event-Severity headers: the
// counter, and when the route last logged one (noteSeverityIgnored).
type severityMismatches struct {
	count prometheus.Counter
	log   throttle.Log // Interval severityLogEvery
}

// destMetrics are one destination's per-try series.
type destMetrics struct {
	classes  [6]prometheus.Counter // by status/100: 0 is classTransport, 2 to 5 are 2xx to 5xx, 1 is nil
	duration prometheus.Observer
	// The gate's gauges (observeGate), waiting in the order of severities.
	limit, inFlight prometheus.Gauge
	waiting         [len(severities)]prometheus.Gauge
}

// newMetrics creates the series, registers them with reg (when not nil) and
// sets every known label combination to zero, so that a scrape shows them
// before the first event.
func newMetrics(reg prometheus.Registerer, cfg *config.Config) (*metrics, error) {
	m := &metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_messages_total",
			Help: "Messages settled, by route and outcome (delivered, redelivery_scheduled, dead_lettered, duplicate_skipped).",
		}, []string{"route", "outcome"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_http_requests_total",
			Help: "HTTP tries, by destination and result class (2xx, 3xx, 4xx, 5xx, transport).",
		}, []string{"destination", "class"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "bridge_delivery_duration_seconds",
			Help:    "Duration of one HTTP try, by destination.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"destination"}),
		circuit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "bridge_circuit_state",
			Help: "Circuit breaker state by destination: 0 closed, 1 half-open, 2 open.",
		}, []string{"destination"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "bridge_in_flight",
			Help: "Messages this bridge is processing (including those held by an open breaker), by route.",
		}, []string{"route"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_dead_letters_total",
			Help: "Dead letters stored, by route and reason (rejected, max-deliveries, invalid-event).",
		}, []string{"route", "reason"}),
		payloadOmitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_dead_letter_payload_omitted_total",
			Help: "Dead letters stored without their payload because they would exceed the server's max_payload or the dead-letter stream's max_msg_size, by route.",
		}, []string{"route"}),
		safetyNet: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_safety_net_failures_total",
			Help: "MAX_DELIVERIES advisories the safety net gave up on as permanent failures (" + joinReasons(safetyNetReasons) + "); the message stays in the source stream.",
		}, []string{"reason"}),
		concurrencyLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "bridge_destination_concurrency_limit",
			Help: "The destination's current concurrency limit (the adaptive limit, or the slow-start ramp while it is lower); 0 when none applies.",
		}, []string{"destination"}),
		gateInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "bridge_destination_in_flight",
			Help: "Attempts admitted by the destination's flow control and not finished, while a concurrency limit, slow start or pause applies.",
		}, []string{"destination"}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "bridge_destination_waiting",
			Help: "Messages held waiting for the destination's flow control, by severity.",
		}, []string{"destination", "severity"}),
		rateLimitedSecs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_destination_rate_limited_seconds_total",
			Help: "Time HTTP tries waited for the destination's rate limit, summed over tries.",
		}, []string{"destination"}),
		pausedSecs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_destination_paused_seconds_total",
			Help: "Time the destination was paused by a 429 or 503 with Retry-After.",
		}, []string{"destination"}),
		fleetWaitSecs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_fleet_rate_wait_seconds_total",
			Help: "Time HTTP tries waited for the fleet-wide rate limit (the whole fleet had spent the window's quota), summed over tries.",
		}, []string{"destination"}),
		fleetErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_fleet_state_errors_total",
			Help: "Failed reads or writes of the flow-control state the replicas share in JetStream, by destination and op (rate: the counter, the replica then keeps to its per-process limit for a second; concurrency: a slot not taken, renewed or released; pause: sharing or watching a pause, an empty destination for the watch).",
		}, []string{"destination", "op"}),
		budgetRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_retry_budget_refused_total",
			Help: "In-process retries the destination's retry budget refused (left to the broker's redelivery).",
		}, []string{"destination"}),
		consumerPending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "bridge_consumer_pending",
			Help: "Messages of the route's stream subjects not yet delivered to its durable consumer (any replica), as of the last consumer lookup (every few seconds, never per scrape).",
		}, []string{"route"}),
		deadLettersStored: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "bridge_dead_letters_stored",
			Help: "Dead letters in the dead-letter stream (every route, every replica), as of the last stream lookup (every few seconds, never per scrape).",
		}),
		idempotencyErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_idempotency_errors_total",
			Help: "Failed reads or writes of the idempotency bucket, by route (a reservation not taken, refreshed, recorded or released).",
		}, []string{"route"}),
		idempotencyConflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bridge_idempotency_conflicts_total",
			Help: "Messages whose event id was already reserved or delivered on the route for another subject or payload (part: subject, payload), by route; each is dead-lettered with reason event-id-conflict. A conflict found again (its dead letter not stored, the message redelivered) counts again.",
		}, []string{"route", "part"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.messages, m.requests, m.duration, m.circuit, m.inFlight, m.deadLetters,
			m.payloadOmitted, m.safetyNet, m.concurrencyLimit, m.gateInFlight, m.waiting, m.rateLimitedSecs, m.pausedSecs, m.fleetWaitSecs, m.fleetErrors, m.budgetRefusals,
			m.consumerPending, m.deadLettersStored, m.idempotencyErrors, m.idempotencyConflicts} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	m.ordered = newOrderingMetrics()
	if reg != nil {
		for _, c := range m.ordered.collectors() {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	m.severityMismatch = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bridge_event_severity_mismatch_total",
		Help: "Deliveries whose Event-Severity header disagreed with the severity token of their subject and was ignored (the subject decides), by route.",
	}, []string{"route"})
	if reg != nil {
		if err := reg.Register(m.severityMismatch); err != nil {
			return nil, err
		}
	}
	m.children.Store(&hotChildren{settled: map[string]map[Outcome]prometheus.Counter{}, dest: map[string]*destMetrics{}, severity: map[string]*severityMismatches{}})
	routes := make([]string, 0, len(cfg.Routes))
	for _, r := range cfg.Routes {
		routes = append(routes, r.Name)
	}
	m.addNames(routes, cfg.DestinationNames())
	for _, reason := range safetyNetReasons {
		m.safetyNet.WithLabelValues(string(reason))
	}
	return m, nil
}

// addNames creates the series of the routes and destinations named (every
// label combination exists from the start, at 0) and the hot path's
// children of those it has none for yet. Callers serialise it (New, and
// Reload under reloadMu).
func (m *metrics) addNames(routes, dests []string) {
	cur := m.children.Load()
	next := &hotChildren{settled: maps.Clone(cur.settled), dest: maps.Clone(cur.dest), severity: maps.Clone(cur.severity)}
	for _, name := range routes {
		if _, ok := next.settled[name]; ok {
			continue
		}
		next.severity[name] = &severityMismatches{count: m.severityMismatch.WithLabelValues(name), log: throttle.Log{Interval: severityLogEvery}}
		children := make(map[Outcome]prometheus.Counter, 4)
		for _, o := range []Outcome{OutcomeDelivered, OutcomeRedeliveryScheduled, OutcomeDeadLettered, OutcomeDuplicateSkipped} {
			children[o] = m.messages.WithLabelValues(name, string(o))
		}
		next.settled[name] = children
		for _, reason := range deadletter.Reasons {
			m.deadLetters.WithLabelValues(name, string(reason))
		}
		for _, part := range []string{ConflictSubject, ConflictPayload} {
			m.idempotencyConflicts.WithLabelValues(name, part)
		}
		m.inFlight.WithLabelValues(name)
		m.payloadOmitted.WithLabelValues(name)
		m.consumerPending.WithLabelValues(name)
		m.idempotencyErrors.WithLabelValues(name)
	}
	for _, name := range dests {
		if _, ok := next.dest[name]; ok {
			continue
		}
		dm := &destMetrics{
			duration: m.duration.WithLabelValues(name),
			limit:    m.concurrencyLimit.WithLabelValues(name),
			inFlight: m.gateInFlight.WithLabelValues(name),
		}
		for _, i := range []int{2, 3, 4, 5, 0} {
			dm.classes[i] = m.requests.WithLabelValues(name, tryClass(i*100))
		}
		for r, sev := range severities {
			dm.waiting[r] = m.waiting.WithLabelValues(name, string(sev))
		}
		next.dest[name] = dm
		m.circuit.WithLabelValues(name)
		m.rateLimitedSecs.WithLabelValues(name)
		m.pausedSecs.WithLabelValues(name)
		m.fleetWaitSecs.WithLabelValues(name)
		m.budgetRefusals.WithLabelValues(name)
	}
	m.children.Store(next)
}

// joinReasons lists reasons for a metric's help.
func joinReasons[R ~string](reasons []R) string {
	var b strings.Builder
	for i, r := range reasons {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(string(r))
	}
	return b.String()
}

// observeTry records one HTTP try: status 0 means no response.
func (m *metrics) observeTry(dest string, status int, took time.Duration) {
	dm := m.children.Load().dest[dest]
	if dm == nil || status < 0 || (status > 0 && status < 100) || status/100 >= len(dm.classes) || dm.classes[status/100] == nil {
		m.requests.WithLabelValues(dest, tryClass(status)).Inc()
		m.duration.WithLabelValues(dest).Observe(took.Seconds())
		return
	}
	dm.classes[status/100].Inc()
	dm.duration.Observe(took.Seconds())
}

// tryClass is the class label of a try: "transport" for no response
// (status 0), else "2xx", "5xx"...
func tryClass(status int) string {
	if status <= 0 {
		return classTransport
	}
	return strconv.Itoa(status/100) + "xx"
}

func (m *metrics) observeSettled(s Settled) {
	if c := m.children.Load().settled[s.Route][s.Outcome]; c != nil {
		c.Inc()
	} else {
		m.messages.WithLabelValues(s.Route, string(s.Outcome)).Inc()
	}
	if s.Outcome == OutcomeDeadLettered {
		m.deadLetters.WithLabelValues(s.Route, string(s.Reason)).Inc()
	}
}

// observeGate sets a destination's flow-control gauges from its gate's
// status; called by the gate with its lock held, on changes only (never
// on its fast path).
// observeGate sets dest's gate gauges: the effective concurrency limit,
// the admitted attempts and the waiters by severity (in the order of
// severities). It is called on every admission and release: a
// destination the metrics were built for uses its gauges as they are, no
// label lookup and no allocation.
func (m *metrics) observeGate(dest string, limit, inFlight int, waiting *[len(severities)][]*waiter) {
	dm := m.children.Load().dest[dest]
	for r, sev := range severities {
		g := prometheus.Gauge(nil)
		if dm != nil {
			g = dm.waiting[r]
		} else {
			g = m.waiting.WithLabelValues(dest, string(sev))
		}
		g.Set(float64(len(waiting[r])))
	}
	if dm == nil {
		m.concurrencyLimit.WithLabelValues(dest).Set(float64(limit))
		m.gateInFlight.WithLabelValues(dest).Set(float64(inFlight))
		return
	}
	dm.limit.Set(float64(limit))
	dm.inFlight.Set(float64(inFlight))
}

func (m *metrics) rateLimited(dest string, waited time.Duration) {
	if waited > 0 {
		m.rateLimitedSecs.WithLabelValues(dest).Add(waited.Seconds())
	}
}

func (m *metrics) paused(dest string, d time.Duration) {
	if d > 0 {
		m.pausedSecs.WithLabelValues(dest).Add(d.Seconds())
	}
}

func (m *metrics) budgetRefused(dest string) { m.budgetRefusals.WithLabelValues(dest).Inc() }
