package config

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sotercare/jetbridge/subjects"
)

// Validate checks every rule of the configuration and returns a
// *ValidationError listing all problems, or nil. Load calls it; call it again
// after changing a Config by hand. Messages name the key path and never
// contain a secret.
func (c *Config) Validate() error { return c.validate(nil, "") }

// validate runs the checks and, when idx is known, places each problem on
// its line of source.
func (c *Config) validate(idx *index, source string) error {
	v := &validator{from: c.from}
	v.nats(&c.NATS)
	v.stream(&c.Stream)
	v.deadLetter(&c.DeadLetter, &c.Stream)
	v.idempotency(&c.Idempotency, &c.Stream)
	v.admin(&c.Admin)
	v.oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	v.oneOf("log.format", c.Log.Format, "json", "console")
	v.positive("shutdown_timeout", c.ShutdownTimeout)
	for _, name := range c.DestinationNames() {
		v.destination(name, c.Destinations[name])
	}
	v.routes(c)
	v.fleet(c)
	v.tracing(&c.Tracing)
	if len(v.errs) == 0 {
		return nil
	}
	for _, fe := range v.errs {
		if line := idx.line(fe.Path); line > 0 {
			fe.File, fe.Line = source, line
		}
	}
	return &ValidationError{Errors: v.errs}
}

type validator struct {
	errs []*FieldError
	from map[string]string // see Config.from
}

// q quotes s, the value at path, unless it came from a reference: then it
// names the reference ("the value of ${N}"), never the value.
func (v *validator) q(path, s string) string {
	if d := originOf(v.from, path); d != "" {
		return d
	}
	return strconv.Quote(s)
}

// val formats x, the value at path, with %v unless it came from a
// reference (see q).
func (v *validator) val(path string, x any) string {
	if d := originOf(v.from, path); d != "" {
		return d
	}
	return fmt.Sprint(x)
}

// list formats items, the list at path, as %q does unless an item came
// from a reference.
func (v *validator) list(path string, items []string) string {
	out := make([]string, len(items))
	for i, s := range items {
		out[i] = v.q(fmt.Sprintf("%s[%d]", path, i), s)
	}
	return "[" + strings.Join(out, " ") + "]"
}

// problem formats err, a problem with the value at path whose text may
// quote it, replacing the whole text when the value came from a reference.
func (v *validator) problem(path string, err error, what string) string {
	if d := originOf(v.from, path); d != "" {
		return d + " is not " + what
	}
	return err.Error()
}

func (v *validator) addf(path, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (v *validator) nats(n *NATS) {
	if n.URL != "" {
		for u := range strings.SplitSeq(n.URL.Value(), ",") {
			if msg := checkURL(strings.TrimSpace(u), "nats", "tls", "ws", "wss"); msg != "" {
				v.addf("nats.url", "%s", msg)
				break
			}
		}
	} else {
		v.listen("nats.embedded.listen", n.Embedded.Listen, false)
		if n.Embedded.StoreDir == "" {
			v.addf("nats.embedded.store_dir", "is required when nats.url is empty")
		}
		v.embeddedExposure(n)
	}

	var auth []string
	if n.CredsFile != "" {
		auth = append(auth, "creds_file")
	}
	if n.NKeySeedFile != "" {
		auth = append(auth, "nkey_seed_file")
	}
	if n.User != "" {
		auth = append(auth, "user")
	} else if n.Password != "" {
		auth = append(auth, "password")
	}
	if n.Token != "" {
		auth = append(auth, "token")
	}
	if len(auth) > 1 {
		v.addf("nats."+auth[len(auth)-1], "cannot be combined with nats.%s: set at most one of creds_file, nkey_seed_file, user+password, token", auth[0])
	}
	if n.Password != "" && n.User == "" {
		v.addf("nats.password", "is set without nats.user")
	}
	v.tls("nats.tls", n.TLS)
	if n.TLS.InsecureSkipVerify {
		v.addf("nats.tls.insecure_skip_verify", "is only allowed for destinations")
	}
}

func (v *validator) stream(s *Stream) {
	v.name("stream.name", s.Name)
	if len(s.Subjects) == 0 {
		v.addf("stream.subjects", "must list at least one subject")
	}
	for i, f := range s.Subjects {
		p := fmt.Sprintf("stream.subjects[%d]", i)
		if err := subjects.ValidateFilter(f); err != nil {
			v.addf(p, "%s", v.problem(p, err, "a valid subject filter"))
			continue
		}
		for j, g := range s.Subjects[:i] {
			if subjects.ValidateFilter(g) == nil && subjects.Overlap(g, f) {
				v.addf(p, "%s overlaps stream.subjects[%d] %s; JetStream refuses overlapping stream subjects", v.q(p, f), j, v.q(fmt.Sprintf("stream.subjects[%d]", j), g))
			}
		}
	}
	v.positive("stream.duplicate_window", s.DuplicateWindow)
	switch {
	case s.MaxAge < 0 || s.MaxAge > 0 && s.MaxAge.D() < 100*time.Millisecond:
		v.addf("stream.max_age", "must be 0 (unlimited) or at least 100ms, got %s", v.val("stream.max_age", s.MaxAge))
	case s.MaxAge > 0 && s.DuplicateWindow > s.MaxAge:
		v.addf("stream.duplicate_window", "must not exceed stream.max_age (%s), got %s", v.val("stream.max_age", s.MaxAge), v.val("stream.duplicate_window", s.DuplicateWindow))
	}
	v.replicas("stream.replicas", s.Replicas)
}

func (v *validator) deadLetter(d *DeadLetter, s *Stream) {
	v.name("dead_letter.stream", d.Stream)
	if d.Stream != "" && d.Stream == s.Name {
		v.addf("dead_letter.stream", "must differ from stream.name %s", v.q("stream.name", s.Name))
	}
	if err := subjects.ValidateSubject(d.SubjectPrefix); err != nil {
		v.addf("dead_letter.subject_prefix", "%s", v.problem("dead_letter.subject_prefix", err, "a valid subject"))
	} else {
		for i, f := range s.Subjects {
			if subjects.ValidateFilter(f) == nil && subjects.Overlap(d.SubjectPrefix+".>", f) {
				v.addf("dead_letter.subject_prefix", "%s overlaps stream subject %s: the stream would capture its own dead letters", v.q("dead_letter.subject_prefix", d.SubjectPrefix), v.q(fmt.Sprintf("stream.subjects[%d]", i), f))
			}
		}
	}
	if d.MaxAge.D() < 100*time.Millisecond {
		v.addf("dead_letter.max_age", "must be at least 100ms (dead-letter retention is always bounded), got %s", v.val("dead_letter.max_age", d.MaxAge))
	}
	v.replicas("dead_letter.replicas", d.Replicas)
}

func (v *validator) idempotency(i *Idempotency, s *Stream) {
	if i.Bucket == "" {
		return
	}
	if !validName(i.Bucket) {
		v.addf("idempotency.bucket", "%s is not a valid bucket name: use [A-Za-z0-9_-]+", v.q("idempotency.bucket", i.Bucket))
	}
	switch {
	case i.TTL <= 0:
		v.addf("idempotency.ttl", "must be > 0, got %s", v.val("idempotency.ttl", i.TTL))
	case i.TTL < s.DuplicateWindow:
		v.addf("idempotency.ttl", "must be at least stream.duplicate_window (%s), got %s", v.val("stream.duplicate_window", s.DuplicateWindow), v.val("idempotency.ttl", i.TTL))
	}
}

func (v *validator) destination(name string, d *Destination) {
	path := "destinations." + name
	if !validName(name) {
		v.addf(path, "destination name %q must match [A-Za-z0-9_-]+", name)
	}
	if d == nil {
		v.addf(path+".url", "is required")
		return
	}
	if d.URL == "" {
		v.addf(path+".url", "is required")
	} else if msg := checkURL(d.URL.Value(), "http", "https"); msg != "" {
		v.addf(path+".url", "%s", msg)
	}
	v.positive(path+".timeout", d.Timeout)
	v.oneOf(path+".format", d.Format, FormatEnvelope, FormatRaw, FormatCloudEvents)
	for _, h := range slices.Sorted(maps.Keys(d.Headers)) {
		hp := path + ".headers." + h
		if !validHeaderName(h) {
			v.addf(hp, "%q is not a valid header name", h)
		}
		if strings.ContainsAny(d.Headers[h].Value(), "\r\n\x00") {
			v.addf(hp, "the value contains a line break or NUL")
		}
	}
	v.backoff(path+".transport_retry", d.TransportRetry)
	if sr := d.StatusRetry; sr != nil {
		p := path + ".status_retry"
		if len(sr.Codes) == 0 {
			v.addf(p+".codes", "must list at least one status (remove status_retry to turn it off)")
		}
		v.statuses(p+".codes", sr.Codes)
		v.backoff(p, sr.Backoff)
		v.positive(p+".max_elapsed", sr.MaxElapsed)
	}

	cb, p := d.CircuitBreaker, path+".circuit_breaker"
	if !(cb.FailureRate > 0 && cb.FailureRate <= 1) {
		v.addf(p+".failure_rate", "must be in (0, 1], got %s", v.val(p+".failure_rate", cb.FailureRate))
	}
	if cb.MinRequests < 1 {
		v.addf(p+".min_requests", "must be at least 1, got %s", v.val(p+".min_requests", cb.MinRequests))
	}
	v.positive(p+".window", cb.Window)
	v.positive(p+".delay", cb.Delay)
	if cb.SuccessThreshold < 1 {
		v.addf(p+".success_threshold", "must be at least 1, got %s", v.val(p+".success_threshold", cb.SuccessThreshold))
	}
	v.statuses(p+".statuses", cb.Statuses)

	if s := d.Signing; s != nil {
		p := path + ".signing.secret"
		if len(s.Secrets) == 0 {
			v.addf(p, "is required when signing is set")
		}
		for i, sec := range s.Secrets {
			sp := p
			if len(s.Secrets) > 1 {
				sp = fmt.Sprintf("%s[%d]", p, i)
			}
			switch k, err := signingKey(sec); {
			case err != nil:
				v.addf(sp, "%v", err)
			case len(k) < 24:
				v.addf(sp, "must be at least 24 bytes after decoding, got %d", len(k))
			}
		}
	}
	v.tls(path+".tls", d.TLS)
	v.flow(path, d)
}

// flow checks a destination's flow-control blocks.
func (v *validator) flow(path string, d *Destination) {
	if rl := d.RateLimit; rl != nil {
		p := path + ".rate_limit"
		if rl.Requests < 1 {
			v.addf(p+".requests", "must be at least 1, got %s", v.val(p+".requests", rl.Requests))
		}
		v.positive(p+".per", rl.Per)
		if rl.Burst < 1 {
			v.addf(p+".burst", "must be at least 1, got %s", v.val(p+".burst", rl.Burst))
		} else if rl.Requests >= 1 && rl.Per > 0 && rl.Per.D()*time.Duration(rl.Burst)/time.Duration(rl.Requests) < time.Millisecond {
			v.addf(p+".burst", "refills faster than once a millisecond (%s requests per %s in bursts of %s): use a smaller burst",
				v.val(p+".requests", rl.Requests), v.val(p+".per", rl.Per), v.val(p+".burst", rl.Burst))
		}
	}
	if c := d.Concurrency; c != nil {
		p := path + ".concurrency"
		if c.Max < 1 {
			v.addf(p+".max", "must be at least 1, got %s", v.val(p+".max", c.Max))
		}
		switch {
		case !c.Adaptive && c.Min != 1:
			v.addf(p+".min", "applies only with adaptive: true")
		case c.Adaptive && (c.Min < 1 || c.Max >= 1 && c.Min > c.Max):
			v.addf(p+".min", "must be between 1 and max (%s), got %s", v.val(p+".max", c.Max), v.val(p+".min", c.Min))
		}
	}
	if b := d.RetryBudget; b != nil {
		p := path + ".retry_budget"
		if !(b.Ratio > 0 && b.Ratio <= 1) {
			v.addf(p+".ratio", "must be in (0, 1], got %s", v.val(p+".ratio", b.Ratio))
		}
		if b.MinPerSecond < 0 {
			v.addf(p+".min_per_second", "must not be negative, got %s", v.val(p+".min_per_second", b.MinPerSecond))
		}
	}
}

func (v *validator) routes(c *Config) {
	if len(c.Routes) == 0 {
		v.addf("routes", "at least one route is required")
	}
	seen := map[string]int{}
	for i, r := range c.Routes {
		p := fmt.Sprintf("routes[%d]", i)
		if r == nil {
			v.addf(p, "is empty")
			continue
		}
		switch j, dup := seen[r.Name]; {
		case r.Name == "":
			v.addf(p+".name", "is required")
		case !validName(r.Name):
			v.addf(p+".name", "%s must match [A-Za-z0-9_-]+", v.q(p+".name", r.Name))
		case dup:
			v.addf(p+".name", "duplicate route name %s (also routes[%d])", v.q(p+".name", r.Name), j)
		default:
			seen[r.Name] = i
		}

		if len(r.Subjects) == 0 {
			v.addf(p+".subjects", "must list at least one subject")
		}
		for k, f := range r.Subjects {
			sp := fmt.Sprintf("%s.subjects[%d]", p, k)
			if err := subjects.ValidateFilter(f); err != nil {
				v.addf(sp, "%s", v.problem(sp, err, "a valid subject filter"))
				continue
			}
			inside := slices.ContainsFunc(c.Stream.Subjects, func(s string) bool {
				return subjects.ValidateFilter(s) == nil && subjects.Covers(s, f)
			})
			if !inside {
				v.addf(sp, "%s is outside the stream's subjects %s", v.q(sp, f), v.list("stream.subjects", c.Stream.Subjects))
			}
			for j, g := range r.Subjects[:k] {
				if subjects.ValidateFilter(g) == nil && subjects.Overlap(g, f) {
					v.addf(sp, "%s overlaps subjects[%d] %s; JetStream refuses overlapping filters in one consumer", v.q(sp, f), j, v.q(fmt.Sprintf("%s.subjects[%d]", p, j), g))
				}
			}
		}

		if _, ok := c.Destinations[r.Destination]; r.Destination == "" {
			v.addf(p+".destination", "is required")
		} else if !ok {
			known := "none is defined"
			if names := c.DestinationNames(); len(names) > 0 {
				known = "defined: " + strings.Join(names, ", ")
			}
			v.addf(p+".destination", "unknown destination %s (%s)", v.q(p+".destination", r.Destination), known)
		}

		if r.MaxDeliver < 1 {
			v.addf(p+".max_deliver", "must be at least 1, got %s", v.val(p+".max_deliver", r.MaxDeliver))
		}
		if len(r.Backoff) == 0 {
			v.addf(p+".backoff", "must list at least one delay")
		}
		for k, d := range r.Backoff {
			v.positive(fmt.Sprintf("%s.backoff[%d]", p, k), d)
		}
		if r.AckWait.D() < time.Second {
			v.addf(p+".ack_wait", "must be at least 1s, got %s", v.val(p+".ack_wait", r.AckWait))
		}
		if r.MaxInFlight < 1 {
			v.addf(p+".max_in_flight", "must be at least 1, got %s", v.val(p+".max_in_flight", r.MaxInFlight))
		}
		v.statuses(p+".redeliver_statuses", r.RedeliverStatuses)
		if r.MaxRetryAfter < 0 {
			v.addf(p+".max_retry_after", "must not be negative, got %s", v.val(p+".max_retry_after", r.MaxRetryAfter))
		}
		if r.Idempotency && c.Idempotency.Bucket == "" {
			v.addf(p+".idempotency", "needs idempotency.bucket, which is empty")
		}
		v.ordering(c, p, r)
	}
}

func (v *validator) backoff(path string, b Backoff) {
	if b.Count < 0 {
		v.addf(path+".count", "must not be negative, got %s", v.val(path+".count", b.Count))
	}
	v.positive(path+".interval", b.Interval)
	if !(b.BackoffFactor >= 1) || math.IsInf(b.BackoffFactor, 1) {
		v.addf(path+".backoff_factor", "must be a number >= 1, got %s", v.val(path+".backoff_factor", b.BackoffFactor))
	}
	if b.MaxInterval < b.Interval {
		v.addf(path+".max_interval", "must be at least interval (%s), got %s", v.val(path+".interval", b.Interval), v.val(path+".max_interval", b.MaxInterval))
	}
}

func (v *validator) statuses(path string, codes []int) {
	for i, code := range codes {
		p := fmt.Sprintf("%s[%d]", path, i)
		switch {
		case code < 100 || code > 599:
			v.addf(p, "must be an HTTP status (100-599), got %s", v.val(p, code))
		case code >= 200 && code <= 299:
			v.addf(p, "must not be a success status, got %s", v.val(p, code))
		}
	}
}

func (v *validator) positive(path string, d Duration) {
	if d <= 0 {
		v.addf(path, "must be > 0, got %s", v.val(path, d))
	}
}

func (v *validator) replicas(path string, n int) {
	if n < 1 || n > 5 {
		v.addf(path, "must be 1 to 5, got %s", v.val(path, n))
	}
}

func (v *validator) oneOf(path, got string, allowed ...string) {
	if !slices.Contains(allowed, got) {
		v.addf(path, "must be one of %s; got %s", strings.Join(allowed, ", "), v.q(path, got))
	}
}

// name checks a JetStream stream name.
func (v *validator) name(path, s string) {
	switch {
	case s == "":
		v.addf(path, "is required")
	case strings.ContainsAny(s, " \t\r\n\f.*>/\\"):
		v.addf(path, "%s is not a valid stream name: no whitespace, '.', '*', '>', '/' or '\\'", v.q(path, s))
	}
}

func (v *validator) listen(path, addr string, optional bool) {
	if addr == "" {
		if !optional {
			v.addf(path, "is required")
		}
		return
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil {
		v.addf(path, "must be host:port, got %s", v.q(path, addr))
	}
}

// embeddedExposure: the embedded server listens on loopback only, unless
// nats.embedded.allow_non_loopback says otherwise on purpose; then it must
// be protected by a token, or a user and password, which it requires of
// every client (the bridge's own connection included). bridge check and
// bridge run apply this one rule.
func (v *validator) embeddedExposure(n *NATS) {
	host, _, err := net.SplitHostPort(n.Embedded.Listen)
	if err != nil {
		return // reported by listen
	}
	if !n.Embedded.AllowNonLoopback {
		if !LoopbackHost(host) {
			v.addf("nats.embedded.listen", "%s is not a loopback address: other hosts could use the embedded JetStream; bind 127.0.0.1, or set nats.embedded.allow_non_loopback: true with nats.token (or nats.user and nats.password) to protect it", v.q("nats.embedded.listen", host))
		}
		return
	}
	if n.Token == "" && (n.User == "" || n.Password == "") {
		v.addf("nats.embedded.allow_non_loopback", "requires nats.token, or nats.user and nats.password: the embedded server then accepts only clients that present them")
	}
	if n.CredsFile != "" || n.NKeySeedFile != "" {
		v.addf("nats.embedded.allow_non_loopback", "protects the embedded server with nats.token or nats.user and nats.password; nats.creds_file and nats.nkey_seed_file need a server of your own (nats.url)")
	}
}

// LoopbackHost reports whether a listen host binds loopback only, as the
// embedded server reads it: empty and "localhost" are 127.0.0.1.
func LoopbackHost(host string) bool {
	if host == "" || strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// minAdminToken is the shortest admin.token accepted, in bytes.
const minAdminToken = 16

// admin checks the admin server: its address, its bearer token (never
// quoted) and its certificate and key, which must exist and parse.
func (v *validator) admin(a *Admin) {
	v.listen("admin.listen", a.Listen, true)
	if tok := a.Token.Value(); tok != "" {
		switch {
		case len(tok) < minAdminToken:
			v.addf("admin.token", "must be at least %d characters: use a random value, e.g. from openssl rand -hex 32", minAdminToken)
		case strings.IndexFunc(tok, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0:
			v.addf("admin.token", "must be printable ASCII without spaces: it is sent as Authorization: Bearer <token>")
		}
	}
	t := a.TLS
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		v.addf("admin.tls.key_file", "is required when admin.tls.cert_file is set")
	case t.CertFile == "" && t.KeyFile != "":
		v.addf("admin.tls.cert_file", "is required when admin.tls.key_file is set")
	case t.CertFile != "":
		v.adminKeyPair(t)
	}
}

// adminKeyPair reads and parses the admin server's certificate and key.
// Errors name the file (unless its path came from a reference) and the
// reason, never the content.
func (v *validator) adminKeyPair(t AdminTLS) {
	read := func(path, file string) []byte {
		data, err := os.ReadFile(file)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			v.addf(path, "cannot read %s: %v", v.q(path, file), err)
			return nil
		}
		return data
	}
	cert := read("admin.tls.cert_file", t.CertFile)
	key := read("admin.tls.key_file", t.KeyFile)
	if cert == nil || key == nil {
		return
	}
	_, err := tls.X509KeyPair(cert, key)
	clear(key)
	if err != nil {
		path := "admin.tls.cert_file"
		if msg := err.Error(); strings.Contains(msg, "key input") || strings.Contains(msg, "private key") {
			path = "admin.tls.key_file"
		}
		v.addf(path, "%s, %s: %v", v.q("admin.tls.cert_file", t.CertFile), v.q("admin.tls.key_file", t.KeyFile), err)
	}
}

func (v *validator) tls(path string, t TLS) {
	if (t.CertFile == "") != (t.KeyFile == "") {
		v.addf(path, "cert_file and key_file must be set together")
	}
}

// checkURL returns a problem with raw as a URL of one of schemes, or "". The
// message never quotes the URL: it may carry credentials.
func checkURL(raw string, schemes ...string) string {
	u, err := url.Parse(raw)
	switch {
	case err != nil || raw == "":
		return "is not a valid URL"
	case !slices.Contains(schemes, u.Scheme):
		return "scheme must be one of " + strings.Join(schemes, ", ")
	case u.Host == "":
		return "has no host"
	}
	return ""
}

// validName reports whether s matches [A-Za-z0-9_-]+.
func validName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// validHeaderName reports whether s is an HTTP field name (RFC 9110 token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)) {
			return false
		}
	}
	return true
}

// FleetSubjects is the subject space of the fleet-wide rate counters the
// bridge creates when a destination has a rate_limit or a concurrency
// limit (docs/delivery.md#across-replicas): stream.subjects must leave it
// alone, or JetStream refuses the counter stream.
const FleetSubjects = "jetbridge.>"

// fleet checks what the fleet-wide flow control needs of the rest of the
// file: its counter stream's subjects outside stream.subjects.
func (v *validator) fleet(c *Config) {
	used := false
	for _, d := range c.Destinations {
		if d != nil && (d.RateLimit != nil || d.Concurrency != nil) {
			used = true
		}
	}
	if !used {
		return
	}
	for i, f := range c.Stream.Subjects {
		if subjects.ValidateFilter(f) == nil && subjects.Overlap(FleetSubjects, f) {
			v.addf(fmt.Sprintf("stream.subjects[%d]", i), "%s overlaps %s, where the fleet-wide flow control keeps its counters (a destination has a rate_limit or a concurrency limit)", v.q(fmt.Sprintf("stream.subjects[%d]", i), f), FleetSubjects)
		}
	}
}
