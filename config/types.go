package config

import "time"

// Config is a validated bridge configuration. Every field holds its final
// value: defaults are applied by Load, and Validate has passed.
type Config struct {
	NATS            NATS                    `yaml:"nats"`
	Stream          Stream                  `yaml:"stream"`
	DeadLetter      DeadLetter              `yaml:"dead_letter"`
	Idempotency     Idempotency             `yaml:"idempotency"`
	Admin           Admin                   `yaml:"admin"`
	Log             Log                     `yaml:"log"`
	ShutdownTimeout Duration                `yaml:"shutdown_timeout"`
	Destinations    map[string]*Destination `yaml:"destinations"`
	Routes          []*Route                `yaml:"routes"`
	Tracing         Tracing                 `yaml:"tracing"`

	// from records, by key path, the values that came from a ${...}
	// reference, so that no error quotes them (see validate).
	from map[string]string
}

// NATS is how the bridge reaches JetStream.
type NATS struct {
	URL          Secret   `yaml:"url"` // may carry user info; empty: embedded server
	Embedded     Embedded `yaml:"embedded"`
	Name         string   `yaml:"name"`
	CredsFile    string   `yaml:"creds_file"`
	NKeySeedFile string   `yaml:"nkey_seed_file"`
	User         string   `yaml:"user"`
	Password     Secret   `yaml:"password"`
	Token        Secret   `yaml:"token"`
	TLS          TLS      `yaml:"tls"`
}

// Embedded configures the JetStream server started when NATS.URL is empty.
type Embedded struct {
	Listen     string `yaml:"listen"`
	StoreDir   string `yaml:"store_dir"`
	SyncAlways bool   `yaml:"sync_always"`
	// AllowNonLoopback lets Listen bind an address other hosts can reach;
	// the server then requires nats.token, or nats.user and nats.password.
	AllowNonLoopback bool `yaml:"allow_non_loopback"`
}

// TLS holds file paths for a TLS client configuration.
type TLS struct {
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"` // destinations only
}

// Stream is the source stream the routes consume from.
type Stream struct {
	Name            string   `yaml:"name"`
	Subjects        []string `yaml:"subjects"`
	Create          bool     `yaml:"create"`
	DuplicateWindow Duration `yaml:"duplicate_window"`
	MaxAge          Duration `yaml:"max_age"`
	Replicas        int      `yaml:"replicas"`
}

// DeadLetter is the stream that receives dead letters.
type DeadLetter struct {
	Stream        string   `yaml:"stream"`
	SubjectPrefix string   `yaml:"subject_prefix"`
	MaxAge        Duration `yaml:"max_age"`
	Replicas      int      `yaml:"replicas"`
}

// Idempotency configures the consumer-side reservation bucket.
type Idempotency struct {
	Bucket string   `yaml:"bucket"`
	TTL    Duration `yaml:"ttl"`
}

// Admin configures the admin HTTP server; an empty Listen disables it.
// With a Token, /status and /metrics (everything but /healthz and
// /readyz) need "Authorization: Bearer <Token>"; with TLS the server
// serves HTTPS only.
type Admin struct {
	Listen string   `yaml:"listen"`
	Token  Secret   `yaml:"token"` // empty: no authentication
	TLS    AdminTLS `yaml:"tls"`
}

// AdminTLS is the admin server's certificate and key (PEM files); both
// empty: plain HTTP.
type AdminTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Enabled reports whether the admin server serves HTTPS.
func (t AdminTLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// Log configures the logger.
type Log struct {
	Level  string `yaml:"level"`  // debug | info | warn | error
	Format string `yaml:"format"` // json | console
	// URLPaths shows the paths and queries of destination URLs in bridge
	// check, logs, /status and span attributes; off, they show as
	// scheme://host:port/… (webhook URLs often carry a secret in the path).
	URLPaths bool `yaml:"url_paths"`
}

// Destination is one HTTP endpoint. Name is the key under destinations.
type Destination struct {
	Name           string            `yaml:"-"`
	URL            Secret            `yaml:"url"`
	Timeout        Duration          `yaml:"timeout"`
	Format         string            `yaml:"format"` // envelope | raw | cloudevents
	Headers        map[string]Secret `yaml:"headers"`
	TransportRetry Backoff           `yaml:"transport_retry"`
	StatusRetry    *StatusRetry      `yaml:"status_retry"` // nil: off
	CircuitBreaker CircuitBreaker    `yaml:"circuit_breaker"`
	Signing        *Signing          `yaml:"signing"` // nil: unsigned
	TLS            TLS               `yaml:"tls"`
	// Flow control (docs/delivery.md#flow-control); nil: no limit.
	RateLimit   *RateLimit   `yaml:"rate_limit"`
	Concurrency *Concurrency `yaml:"concurrency"`
	RetryBudget *RetryBudget `yaml:"retry_budget"`
	// ForwardBaggage lets the W3C baggage of a message's trace go on to
	// the destination (docs/tracing.md); false: it never does.
	ForwardBaggage bool `yaml:"forward_baggage"`
}

// RateLimit caps the requests started to a destination: Requests per Per,
// in bursts of at most Burst.
type RateLimit struct {
	Requests int      `yaml:"requests"`
	Per      Duration `yaml:"per"`
	Burst    int      `yaml:"burst"`
}

// Concurrency caps the requests in flight to a destination across all its
// routes: Max, or with Adaptive a limit between Min and Max that follows
// the destination's latency.
type Concurrency struct {
	Max      int  `yaml:"max"`
	Adaptive bool `yaml:"adaptive"`
	Min      int  `yaml:"min"`
}

// RetryBudget bounds the in-process retries to a destination: retries in
// flight may exceed Ratio of its requests in flight only while fewer than
// MinPerSecond retries are in flight.
type RetryBudget struct {
	Ratio        float64 `yaml:"ratio"`
	MinPerSecond int     `yaml:"min_per_second"`
}

// Backoff is an in-process retry schedule: Count retries after the first
// try, the n-th waiting Interval*BackoffFactor^(n-1), capped at MaxInterval.
// The bridge hands these values to failsafe-go's retry policy
// (WithBackoffFactor), which computes the delays.
type Backoff struct {
	Count         int      `yaml:"count"`
	Interval      Duration `yaml:"interval"`
	BackoffFactor float64  `yaml:"backoff_factor"`
	MaxInterval   Duration `yaml:"max_interval"`
}

// StatusRetry retries the listed HTTP statuses in-process.
type StatusRetry struct {
	Codes      []int `yaml:"codes"`
	Backoff    `yaml:",inline"`
	MaxElapsed Duration `yaml:"max_elapsed"`
}

// CircuitBreaker configures the per-destination breaker.
type CircuitBreaker struct {
	Enabled          bool     `yaml:"enabled"`
	FailureRate      float64  `yaml:"failure_rate"`
	MinRequests      int      `yaml:"min_requests"`
	Window           Duration `yaml:"window"`
	Delay            Duration `yaml:"delay"`
	SuccessThreshold int      `yaml:"success_threshold"`
	Statuses         []int    `yaml:"statuses"`
}

// Signing configures Standard Webhooks signatures. Several secrets allow
// rotation: every request carries one signature per secret.
type Signing struct {
	Secrets []Secret `yaml:"secret"`
}

// Route binds subjects to one destination through one durable consumer.
type Route struct {
	Name              string     `yaml:"name"`
	Subjects          []string   `yaml:"subjects"`
	Destination       string     `yaml:"destination"`
	MaxDeliver        int        `yaml:"max_deliver"`
	Backoff           []Duration `yaml:"backoff"`
	AckWait           Duration   `yaml:"ack_wait"`
	MaxInFlight       int        `yaml:"max_in_flight"`
	RedeliverStatuses []int      `yaml:"redeliver_statuses"`
	MaxRetryAfter     Duration   `yaml:"max_retry_after"`
	Idempotency       bool       `yaml:"idempotency"`
	// Paused: nothing is pulled for the route; its consumer is kept (and
	// created when absent). A reload pauses or resumes a route live
	// (docs/configuration.md#what-a-reload-applies).
	Paused bool `yaml:"paused"`
	// Ordering delivers the messages of one key in order
	// (docs/configuration.md#routes); nil: unordered (concurrent).
	Ordering *Ordering `yaml:"ordering"`
}

// Duration is a time.Duration written as a Go duration string ("250ms").
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }
