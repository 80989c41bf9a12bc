package bridge

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/cenkalti/backoff/v5"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
)

// destination is one HTTP endpoint: what its requests are made of
// (request.go renders them), and its pipeline (pipeline.go), built from
// its configuration, which runs every attempt (attempt.go). Every route
// delivering to the destination shares it: its flow control (flow.go), its
// breaker (breaker.go) and its connection pool (transport.go).
//
// Its lifecycle: newDestination builds it from a config value, replace
// swaps its pipeline for another built from a new one (an attempt runs on
// the pipeline it started with), close ends it once every attempt has
// ended.
type destination struct {
	cfg    *config.Destination // what it was built from; never changed
	name   string
	format string
	// baseHeader is the configured headers, canonical, without the
	// signature headers (only the bridge signs); nil when none.
	baseHeader http.Header
	secrets    [][]byte
	// reqTemplate is the POST every try copies (request.go), its URL
	// parsed once; the pipeline's transport sends it directly (net/http's
	// Transport never follows a redirect, and http.Client's bookkeeping
	// would copy the headers of every request).
	reqTemplate *http.Request

	pipe atomic.Pointer[pipeline]
	// gate is the flow control every pipeline of the destination starts
	// with (its waiters, pause and slow start outlive a replace).
	gate   *gate
	budget *retryBudget // nil: in-process retries are not budgeted
	// poolSize is the sum of max_in_flight of the routes using this
	// destination: the most requests it can have in flight at once.
	poolSize int
	held     atomic.Int64 // messages of every route held by the open breaker
	m        *metrics
	log      zerolog.Logger
	trace    *destTrace // try spans (trace.go); nil when tracing is off

	// The breaker's reports (breaker.go): changed is closed and replaced on
	// every transition; transitions are reported (logged, counted, passed
	// to onState) in chain order.
	changed   atomic.Pointer[chan struct{}]
	onState   func(dest string, from, to BreakerState)
	transMu   sync.Mutex
	reported  BreakerState      // the state the last reported transition led to
	early     [][2]BreakerState // transitions that arrived before their predecessor
	outage    outage            // the current outage, while the breaker is not closed
	reminders backoff.ExponentialBackOff
	closed    bool // close was called: no more reminders
}

func newDestination(cfg *config.Destination, log zerolog.Logger, onState func(dest string, from, to BreakerState), m *metrics) (*destination, error) {
	d := &destination{
		cfg:       cfg,
		m:         m,
		name:      cfg.Name,
		format:    cfg.Format,
		log:       log.With().Str("destination", cfg.Name).Logger(),
		onState:   onState,
		reminders: outageReminders(),
		budget:    newRetryBudget(cfg.RetryBudget),
	}
	d.gate = newGate(newLimiter(cfg.Concurrency), d.name, m, d.log)
	ch := make(chan struct{})
	d.changed.Store(&ch)
	for k, v := range cfg.Headers {
		if d.baseHeader == nil {
			d.baseHeader = make(http.Header, len(cfg.Headers))
		}
		d.baseHeader.Set(k, v.Value())
	}
	for _, k := range []string{"Webhook-Id", "Webhook-Timestamp", "Webhook-Signature"} {
		d.baseHeader.Del(k) // only the bridge signs
	}
	var err error
	if d.reqTemplate, d.baseHeader, err = requestTemplate(cfg.URL.Value(), d.baseHeader); err != nil {
		return nil, fmt.Errorf("bridge: destination %s: url does not parse", cfg.Name) // never quoted: it may carry credentials
	}
	if cfg.Signing != nil {
		keys, err := cfg.Signing.Keys()
		if err != nil {
			return nil, fmt.Errorf("bridge: destination %s: %w", cfg.Name, err)
		}
		d.secrets = keys
	}
	tlsConf, err := clientTLS(cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("bridge: destination %s: %w", cfg.Name, err)
	}
	d.pipe.Store(newPipeline(cfg, d, destinationTransport(tlsConf, maxResponseHeaderBytes)))
	return d, nil
}

// replace makes p the destination's pipeline and returns the one it
// replaces, which the caller closes once the attempts running on it have
// ended. Live reconfiguration builds p with newPipeline from the new
// config value.
func (d *destination) replace(p *pipeline) (old *pipeline) {
	return d.pipe.Swap(p)
}

// breaker is the current pipeline's breaker; nil when disabled.
func (d *destination) breaker() circuitbreaker.CircuitBreaker[*response] {
	if p := d.pipe.Load(); p != nil {
		return p.breaker
	}
	return nil
}

// close stops the outage reminders and the gate's timer and closes idle
// connections; Run calls it once every attempt has ended.
func (d *destination) close() {
	d.stopReminders()
	d.gate.close()
	d.pipe.Load().close()
}
