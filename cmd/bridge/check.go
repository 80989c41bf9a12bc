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

	"github.com/sotercare/jetbridge/config"
)

// loadConfig loads and validates the file, printing every problem, one per
// line, on stderr. Its error carries exit code 2.
func loadConfig(path string, stderr io.Writer) (*config.Config, error) {
	if path == "" {
		return nil, usageErr("--config is required (or set $BRIDGE_CONFIG)")
	}
	cfg, err := config.LoadFile(path)
	if err != nil {
		var ve *config.ValidationError
		if errors.As(err, &ve) {
			for _, e := range ve.Unwrap() {
				fmt.Fprintln(stderr, "bridge: "+e.Error())
			}
			return nil, &exitError{code: 2}
		}
		return nil, &exitError{code: 2, msg: err.Error()}
	}
	return cfg, nil
}

func cmdCheck(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("check", stderr)
	path := configFlag(fs)
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr("check takes no arguments, got %q", pos[0])
	}
	cfg, err := loadConfig(*path, stderr)
	if err != nil {
		return err
	}
	if err := checkNATSFiles(cfg.NATS); err != nil {
		return configFileErr(err, stderr)
	}
	for _, w := range configWarnings(cfg) {
		fmt.Fprintf(stderr, "bridge: warning: %s: %s\n", w.key, w.text)
	}
	printRoutingTable(stdout, cfg)
	return nil
}

// configFileErr prints each problem of checkNATSFiles on its own line and
// returns exit code 2.
func configFileErr(err error, stderr io.Writer) error {
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		for _, e := range joined.Unwrap() {
			fmt.Fprintln(stderr, "bridge: "+e.Error())
		}
		return &exitError{code: 2}
	}
	return &exitError{code: 2, msg: err.Error()}
}

// configWarning is a valid setting with which operators can hurt
// themselves.
type configWarning struct{ key, text string }

// configWarnings lists destinations whose TLS certificates are not
// verified and an admin listener reachable from other hosts. bridge check
// prints them (exit code unchanged), bridge run logs them at warn level.
func configWarnings(cfg *config.Config) []configWarning { return warningsWith(cfg, loopbackListen) }

// warningsWith is configWarnings with its loopback test as a parameter.
func warningsWith(cfg *config.Config, loopback func(hostPort string) bool) []configWarning {
	var out []configWarning
	for _, name := range cfg.DestinationNames() {
		if cfg.Destinations[name].TLS.InsecureSkipVerify {
			out = append(out, configWarning{"destinations." + name + ".tls.insecure_skip_verify",
				"true: the destination's TLS certificate is not verified, so anyone on the network path can read and change deliveries"})
		}
	}
	if l := cfg.Admin.Listen; l != "" && !loopback(l) {
		out = append(out, configWarning{"admin.listen",
			fmt.Sprintf("%q is reachable from other hosts: /status and /metrics have no authentication; bind 127.0.0.1 unless a firewall or proxy guards it", l)})
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

// printRoutingTable writes the routes and the policies of their
// destinations. Secrets (URL user info, query values, header values) are
// never printed.
func printRoutingTable(w io.Writer, cfg *config.Config) {
	nats := "embedded JetStream on " + cfg.NATS.Embedded.Listen + " (store " + cfg.NATS.Embedded.StoreDir + ")"
	if !cfg.Embedded() {
		nats = cfg.NATS.URL.RedactedURL()
	}
	fmt.Fprintf(w, "configuration OK\n\nnats:        %s\nstream:      %s %s (dup window %s)\ndead letter: %s (%s.<route>.<subject>, max age %s)\n",
		nats, cfg.Stream.Name, strings.Join(cfg.Stream.Subjects, ","), cfg.Stream.DuplicateWindow,
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

	fmt.Fprintln(w, "\ndestinations:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  DESTINATION\tURL\tFORMAT\tTIMEOUT\tTRANSPORT RETRY\tSTATUS RETRY\tCIRCUIT BREAKER\tSIGNED")
	for _, name := range cfg.DestinationNames() {
		d := cfg.Destinations[name]
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
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, d.URL.RedactedURL(), d.Format, d.Timeout, tr, sr, cb, signed)
	}
	tw.Flush()
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
