package bridge

import (
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sotercare/jetbridge/config"
)

// HTTP request classes of bridge_http_requests_total.
const (
	ClassTransport = "transport"
)

// metrics are the Prometheus series listed in the README's metrics section. Their labels carry only
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
	// failures (see advisory.go).
	safetyNet *prometheus.CounterVec // reason
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
			Help: "MAX_DELIVERIES advisories the safety net gave up on as permanent failures (" + strings.Join(safetyNetReasons, ", ") + "); the message stays in the source stream.",
		}, []string{"reason"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.messages, m.requests, m.duration, m.circuit, m.inFlight, m.deadLetters,
			m.payloadOmitted, m.safetyNet} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	for _, r := range cfg.Routes {
		for _, o := range []string{OutcomeDelivered, OutcomeRedeliveryScheduled, OutcomeDeadLettered, OutcomeDuplicateSkipped} {
			m.messages.WithLabelValues(r.Name, o)
		}
		for _, reason := range []string{ReasonRejected, ReasonMaxDeliveries, ReasonInvalidEvent} {
			m.deadLetters.WithLabelValues(r.Name, reason)
		}
		m.inFlight.WithLabelValues(r.Name)
		m.payloadOmitted.WithLabelValues(r.Name)
	}
	for _, reason := range safetyNetReasons {
		m.safetyNet.WithLabelValues(reason)
	}
	for name := range cfg.Destinations {
		for _, c := range []string{"2xx", "3xx", "4xx", "5xx", ClassTransport} {
			m.requests.WithLabelValues(name, c)
		}
		m.circuit.WithLabelValues(name)
		m.duration.WithLabelValues(name)
	}
	return m, nil
}

// observeTry records one HTTP try: status 0 means no response.
func (m *metrics) observeTry(dest string, status int, took time.Duration) {
	class := ClassTransport
	if status > 0 {
		class = strconv.Itoa(status/100) + "xx"
	}
	m.requests.WithLabelValues(dest, class).Inc()
	m.duration.WithLabelValues(dest).Observe(took.Seconds())
}

func (m *metrics) observeSettled(s Settled) {
	m.messages.WithLabelValues(s.Route, s.Outcome).Inc()
	if s.Outcome == OutcomeDeadLettered {
		m.deadLetters.WithLabelValues(s.Route, s.Reason).Inc()
	}
}
