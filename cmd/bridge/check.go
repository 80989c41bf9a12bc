package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/cli"
)

func newCheckCmd() *cobra.Command {
	var path string
	var asJSON bool
	c := &cobra.Command{
		Use:   "check",
		Short: "validate the configuration and print the routing table",
		Long: `Validate a configuration file (every problem at once, each on its own line
naming the key and the line; an unknown key with the nearest known one) and
print the routing table: routes, subjects, destinations and their
policies. Secrets are never printed. Exit 0 when valid, 2 when
not; warnings (unverified TLS, an admin listener open to other hosts) do
not change the exit code.`,
		Example: `  bridge check --config config/quickstart.yaml
  bridge check --config config/quickstart.yaml --json | jq .routes`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return cmdCheck(path, asJSON, c.OutOrStdout(), c.ErrOrStderr())
		},
	}
	configFlag(c.Flags(), &path)
	c.Flags().BoolVar(&asJSON, "json", false, `print one JSON object: {"ok","errors","warnings","nats","stream","routes","destinations"}`)
	return c
}

func cmdCheck(path string, asJSON bool, stdout, stderr io.Writer) error {
	var problems strings.Builder
	errw := io.MultiWriter(stderr, &problems)
	cfg, source, err := loadConfig(path, "", errw)
	if err == nil {
		if ferr := checkNATSFiles(cfg.NATS); ferr != nil {
			err = configFileErr(ferr, errw)
		}
	}
	if err == nil {
		if terr := tracingEnvErr(cfg); terr != nil {
			err = configFileErr(terr, errw)
		}
	}
	if err != nil {
		if asJSON {
			var ee *exitError
			if errors.As(err, &ee) && ee.Msg != "" {
				problems.WriteString("bridge: " + ee.Msg + "\n")
			}
			var list []string
			for _, l := range lines(problems.String()) {
				list = append(list, strings.TrimPrefix(l, "bridge: "))
			}
			_ = cli.WriteJSON(stdout, checkReport{OK: false, Errors: list, Warnings: []configWarning{}})
		}
		return err
	}
	warnings := configWarnings(cfg)
	for _, w := range warnings {
		fmt.Fprintf(stderr, "bridge: warning: %s: %s\n", w.Key, w.Text)
	}
	if asJSON {
		return cli.WriteJSON(stdout, newCheckReport(cfg, source, warnings))
	}
	printRoutingTable(stdout, cfg, source)
	return nil
}

// lines splits text into its lines, without the last newline.
func lines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// configFileErr prints each problem of checkNATSFiles on its own line and
// returns exit code 2.
func configFileErr(err error, stderr io.Writer) error {
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		for _, e := range joined.Unwrap() {
			fmt.Fprintln(stderr, "bridge: "+e.Error())
		}
		return &exitError{Code: 2}
	}
	return &exitError{Code: 2, Msg: err.Error()}
}

// configWarning is a valid setting with which operators can hurt
// themselves.
type configWarning struct {
	Key  string `json:"key"`
	Text string `json:"text"`
}

// configWarnings lists destinations whose TLS certificates are not
// verified, an admin listener reachable from other hosts and, while
// tracing is off, malformed OTEL_* variables. bridge check prints them
// (exit code unchanged), bridge run logs them at warn level.
func configWarnings(cfg *config.Config) []configWarning {
	return append(warningsWith(cfg, loopbackListen), tracingEnvWarnings(cfg)...)
}

// warningsWith is configWarnings with its loopback test as a parameter.
func warningsWith(cfg *config.Config, loopback func(hostPort string) bool) []configWarning {
	var out []configWarning
	for _, name := range cfg.DestinationNames() {
		if cfg.Destinations[name].TLS.InsecureSkipVerify {
			out = append(out, configWarning{"destinations." + name + ".tls.insecure_skip_verify",
				"true: the destination's TLS certificate is not verified, so anyone on the network path can read and change deliveries"})
		}
	}
	if l := cfg.Admin.Listen; l != "" && !loopback(l) && cfg.Admin.Token == "" {
		out = append(out, configWarning{"admin.listen",
			fmt.Sprintf("%q is reachable from other hosts and admin.token is not set: /status and /metrics have no authentication; set admin.token (e.g. token: ${ADMIN_TOKEN}), or bind 127.0.0.1 unless a firewall or proxy guards it", l)})
	}
	return out
}

// loopbackListen reports whether host:port binds loopback only (an empty
// host, 0.0.0.0 and :: bind every interface).
func loopbackListen(hostPort string) bool {
	host, _, err := net.SplitHostPort(hostPort)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkReport is the output of check --json.
type checkReport struct {
	OK           bool               `json:"ok"`
	Errors       []string           `json:"errors,omitempty"`
	Warnings     []configWarning    `json:"warnings"`
	NATS         string             `json:"nats,omitempty"`
	Stream       *checkStream       `json:"stream,omitempty"`
	DeadLetter   *checkDeadLetter   `json:"dead_letter,omitempty"`
	Routes       []checkRoute       `json:"routes,omitempty"`
	Destinations []checkDestination `json:"destinations,omitempty"`
}

type checkStream struct {
	Name            string   `json:"name"`
	Subjects        []string `json:"subjects"`
	DuplicateWindow string   `json:"duplicate_window"`
}

type checkDeadLetter struct {
	Stream        string `json:"stream"`
	SubjectPrefix string `json:"subject_prefix"`
	MaxAge        string `json:"max_age"`
}

type checkRoute struct {
	Name              string   `json:"name"`
	Subjects          []string `json:"subjects"`
	Destination       string   `json:"destination"`
	MaxDeliver        int      `json:"max_deliver"`
	Backoff           []string `json:"backoff"`
	AckWait           string   `json:"ack_wait"`
	MaxInFlight       int      `json:"max_in_flight"`
	RedeliverStatuses []int    `json:"redeliver_statuses"`
	Idempotency       bool     `json:"idempotency"`
	// Ordering is an ordered route's key and partitions; nil: unordered.
	Ordering *checkOrdering `json:"ordering,omitempty"`
}

// checkOrdering is an ordered route's ordering (docs/delivery.md#ordered-delivery).
type checkOrdering struct {
	Key          string `json:"key"`
	Partitions   int    `json:"partitions"`
	Copy         string `json:"copy"`
	PinnedTTL    string `json:"pinned_ttl"`
	OnDeadLetter string `json:"on_dead_letter"`
}

// orderingRow is route rt's ordering, nil when it is unordered. The
// pinned TTL (the hand-over bound) is ack_wait + 1s.
func orderingRow(cfg *config.Config, rt *config.Route) *checkOrdering {
	o := rt.Ordering
	if o == nil {
		return nil
	}
	return &checkOrdering{o.Key.String(), o.Partitions, config.CopyStream(cfg.Stream.Name, rt.Name),
		(rt.AckWait.D() + time.Second).String(), o.OnDeadLetter}
}

// checkDestination is one destination as the table shows it: the URL
// redacted, each policy as one text.
type checkDestination struct {
	Name           string `json:"name"`
	URL            string `json:"url"`
	Format         string `json:"format"`
	Timeout        string `json:"timeout"`
	TransportRetry string `json:"transport_retry"`
	StatusRetry    string `json:"status_retry"`
	CircuitBreaker string `json:"circuit_breaker"`
	Signed         string `json:"signed"`
	FlowControl    string `json:"flow_control"`
	ForwardBaggage bool   `json:"forward_baggage"`
}

// natsText is where the configuration's NATS is, without secrets; source
// is where the URL came from when not nats.url.
func natsText(cfg *config.Config, source string) string {
	if !cfg.Embedded() {
		if source != "" {
			return cfg.NATS.URL.RedactedURL() + " (from " + source + ")"
		}
		return cfg.NATS.URL.RedactedURL()
	}
	return "embedded JetStream on " + cfg.NATS.Embedded.Listen + " (store " + cfg.NATS.Embedded.StoreDir + ")"
}

func newCheckReport(cfg *config.Config, source string, warnings []configWarning) checkReport {
	r := checkReport{
		OK: true, Warnings: append([]configWarning{}, warnings...), NATS: natsText(cfg, source),
		Stream:     &checkStream{cfg.Stream.Name, cfg.Stream.Subjects, cfg.Stream.DuplicateWindow.String()},
		DeadLetter: &checkDeadLetter{cfg.DeadLetter.Stream, cfg.DeadLetter.SubjectPrefix, cfg.DeadLetter.MaxAge.String()},
	}
	for _, rt := range cfg.Routes {
		backoff := make([]string, len(rt.Backoff))
		for i, b := range rt.Backoff {
			backoff[i] = b.String()
		}
		r.Routes = append(r.Routes, checkRoute{rt.Name, rt.Subjects, rt.Destination, rt.MaxDeliver, backoff,
			rt.AckWait.String(), rt.MaxInFlight, rt.RedeliverStatuses, rt.Idempotency, orderingRow(cfg, rt)})
	}
	for _, name := range cfg.DestinationNames() {
		r.Destinations = append(r.Destinations, destinationRow(name, cfg.Destinations[name], cfg.Log.URLPaths))
	}
	return r
}

// destinationRow is one destination of the routing table; its URL shows
// its path only with log.url_paths.
func destinationRow(name string, d *config.Destination, urlPaths bool) checkDestination {
	tr := "off"
	if d.TransportRetry.Count > 0 {
		tr = retryText(d.TransportRetry)
	}
	sr := "off"
	if d.StatusRetry != nil && d.StatusRetry.Count > 0 {
		sr = ints(d.StatusRetry.Codes) + " " + retryText(d.StatusRetry.Backoff) + " within " + d.StatusRetry.MaxElapsed.String()
	}
	cb := "off"
	if c := d.CircuitBreaker; c.Enabled {
		cb = fmt.Sprintf("%.0f%% of >=%d in %s on transport,%s; open %s", c.FailureRate*100, c.MinRequests, c.Window, ints(c.Statuses), c.Delay)
	}
	signed := "no"
	if d.Signing != nil && len(d.Signing.Secrets) > 0 {
		signed = fmt.Sprintf("yes (%d key)", len(d.Signing.Secrets))
	}
	return checkDestination{name, d.URL.ShownURL(urlPaths), string(d.Format), d.Timeout.String(), tr, sr, cb, signed, flowText(d), d.ForwardBaggage}
}

// flowText is a destination's flow control (docs/delivery.md#flow-control) in
// one text; "off" when none is configured (slow start always applies).
func flowText(d *config.Destination) string {
	var parts []string
	if rl := d.RateLimit; rl != nil {
		parts = append(parts, fmt.Sprintf("rate %d/%s burst %d", rl.Requests, rl.Per, rl.Burst))
	}
	if c := d.Concurrency; c != nil {
		if c.Adaptive {
			parts = append(parts, fmt.Sprintf("concurrency adaptive %d..%d, severity first", c.Min, c.Max))
		} else {
			parts = append(parts, fmt.Sprintf("concurrency %d, severity first", c.Max))
		}
	}
	if b := d.RetryBudget; b != nil {
		parts = append(parts, fmt.Sprintf("retries <= %g of requests + %d/s", b.Ratio, b.MinPerSecond))
	}
	if len(parts) == 0 {
		return "off"
	}
	return strings.Join(parts, "; ")
}

// printRoutingTable writes the routes and the policies of their
// destinations. Secrets (URL user info, query values, header values) are
// never printed.
func printRoutingTable(w io.Writer, cfg *config.Config, source string) {
	fmt.Fprintf(w, "configuration OK\n\nnats:        %s\nstream:      %s %s (dup window %s)\ndead letter: %s (%s.<route>.<subject>, max age %s)\n",
		natsText(cfg, source), cfg.Stream.Name, strings.Join(cfg.Stream.Subjects, ","), cfg.Stream.DuplicateWindow,
		cfg.DeadLetter.Stream, cfg.DeadLetter.SubjectPrefix, cfg.DeadLetter.MaxAge)
	if cfg.Idempotency.Bucket != "" {
		fmt.Fprintf(w, "idempotency: bucket %s, ttl %s\n", cfg.Idempotency.Bucket, cfg.Idempotency.TTL)
	}

	fmt.Fprintln(w, "\nroutes:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  ROUTE\tSUBJECTS\tDESTINATION\tMAX DELIVER\tBACKOFF\tACK WAIT\tIN FLIGHT\tREDELIVER ON\tIDEMPOTENT")
	for _, r := range cfg.Routes {
		backoff := make([]string, len(r.Backoff))
		for i, b := range r.Backoff {
			backoff[i] = b.String()
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\t%d\t%s\t%t\n", r.Name, strings.Join(r.Subjects, ","), r.Destination,
			r.MaxDeliver, strings.Join(backoff, ","), r.AckWait, r.MaxInFlight, ints(r.RedeliverStatuses), r.Idempotency)
	}
	tw.Flush()
	printOrdering(w, cfg)

	fmt.Fprintln(w, "\ndestinations:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  DESTINATION\tURL\tFORMAT\tTIMEOUT\tTRANSPORT RETRY\tSTATUS RETRY\tCIRCUIT BREAKER\tSIGNED\tFLOW CONTROL\tBAGGAGE")
	for _, name := range cfg.DestinationNames() {
		d := destinationRow(name, cfg.Destinations[name], cfg.Log.URLPaths)
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, d.URL, d.Format, d.Timeout, d.TransportRetry, d.StatusRetry, d.CircuitBreaker, d.Signed, d.FlowControl, baggageText(d.ForwardBaggage))
	}
	tw.Flush()
}

// printOrdering writes the ordered routes' keys and partitions, if any.
func printOrdering(w io.Writer, cfg *config.Config) {
	var rows []*checkOrdering
	var names []string
	for _, rt := range cfg.Routes {
		if o := orderingRow(cfg, rt); o != nil {
			rows, names = append(rows, o), append(names, rt.Name)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\nordering:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  ROUTE\tKEY\tPARTITIONS\tCOPY\tPINNED TTL\tON DEAD LETTER")
	for i, o := range rows {
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\n", names[i], o.Key, o.Partitions, o.Copy, o.PinnedTTL, o.OnDeadLetter)
	}
	tw.Flush()
}

// baggageText is the BAGGAGE column: whether a message's W3C baggage goes
// on to the destination (forward_baggage).
func baggageText(forward bool) string {
	if forward {
		return "forwarded"
	}
	return "not forwarded"
}

func retryText(b config.Backoff) string {
	return fmt.Sprintf("%dx %s..%s (x%g)", b.Count, b.Interval, time.Duration(b.MaxInterval), b.BackoffFactor)
}

func ints(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
