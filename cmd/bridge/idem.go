package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/idempotency"
	"github.com/sotercare/jetbridge/internal/cli"
	"github.com/sotercare/jetbridge/subjects"
)

const idemLong = `Show or forget one event's idempotency record: on a route with
idempotency: true the bridge keeps, per event id, a record in the
idempotency.bucket key-value bucket (in flight while a delivery holds it,
done after a 2xx). A later message with the same event id and the same
subject and payload is a duplicate; with another subject or payload it is
dead-lettered with reason event-id-conflict, as long as the record stands.
"idem forget" removes the record, after which "dlq replay --include
event-id-conflict" delivers the dead letter.

The commands connect as the dlq commands do (--server, nats.url,
$NATS_URL, else the running bridge's embedded server). Text from the
record (the subject) is printed escaped and cut at 1 KiB.`

const idemExample = `  bridge idem show --config config/sotercare.yaml fall-8
  bridge idem forget --config config/sotercare.yaml fall-8 --route caregiver-alerts --yes`

func newIdemCmd() *cobra.Command {
	c := &cobra.Command{Use: "idem", Short: "show or forget one event's idempotency record", Long: idemLong, Example: idemExample}
	cli.Group(c)
	c.AddCommand(newIdemShowCmd(), newIdemForgetCmd())
	return c
}

// idemOptions are the flags both idem commands take.
type idemOptions struct {
	config, server, route string
	asJSON                bool
}

// idemSession is one idem command's connection and the configuration's
// idempotent routes.
type idemSession struct {
	*dlqSession
	store  *idempotency.Store
	routes []string // routes with idempotency: true, in configuration order
}

// idemCommand is the one setup of the idem commands, as dlqCommand is of
// the dlq ones: flags registered; on run, check (argument checks, bad
// usage before any connection), then the configuration loaded, the route
// checked against it, the connection opened (the dlq commands' own) and
// the bucket bound; work gets the session and the event id.
func idemCommand(c *cobra.Command, o *idemOptions, check func(args []string) error,
	work func(ctx context.Context, s *idemSession, eventID string, c *cobra.Command) error) *cobra.Command {
	f := c.Flags()
	configFlag(f, &o.config)
	serverFlag(f, &o.server)
	f.StringVar(&o.route, "route", "", "the route (one with idempotency: true)")
	f.BoolVar(&o.asJSON, "json", false, "one JSON object per record")
	name := "idem " + strings.Fields(c.Use)[0]
	c.RunE = func(c *cobra.Command, args []string) error {
		if len(args) != 1 || args[0] == "" {
			return usageErr("%s takes exactly one EVENT_ID, got %d arguments", name, len(args))
		}
		if o.route != "" && subjects.ValidateToken(o.route) != nil {
			return usageErr("%s: --route %q is not a route name", name, o.route)
		}
		if err := check(args); err != nil {
			return err
		}
		stderr := c.ErrOrStderr()
		// Signals are caught from before the connection, as the dlq
		// commands do (a stopped bridge's store is served privately).
		ctx, stop := signalContext()
		defer stop()
		s, err := openDLQ(o.config, o.server, stderr)
		if err != nil {
			return err
		}
		defer s.close()
		is := &idemSession{dlqSession: s, routes: idempotentRoutes(s.cfg)}
		if len(is.routes) == 0 {
			return usageErr("%s: no route has idempotency: true in this configuration", name)
		}
		if o.route != "" && !slices.Contains(is.routes, o.route) {
			return usageErr("%s: --route %s is not a route with idempotency: true (those are: %s)", name, o.route, strings.Join(is.routes, ", "))
		}
		if is.store, err = idempotency.Open(ctx, s.js, s.cfg.Idempotency.Bucket); err != nil {
			if errors.Is(err, jetstream.ErrBucketNotFound) {
				return fmt.Errorf("idempotency bucket %s does not exist (has the bridge run with this configuration?)", s.cfg.Idempotency.Bucket)
			}
			return idemErr(err)
		}
		return work(ctx, is, args[0], c)
	}
	return c
}

func idempotentRoutes(cfg *config.Config) []string {
	var rs []string
	for _, r := range cfg.Routes {
		if r.Idempotency {
			rs = append(rs, r.Name)
		}
	}
	return rs
}

// idemErr is a library error as the command prints it.
func idemErr(err error) error {
	if errors.Is(err, context.Canceled) {
		return &exitError{Code: 1, Msg: "interrupted"}
	}
	return errors.New(shown(strings.TrimPrefix(err.Error(), "idempotency: ")))
}

// idemJSON is one record of --json; fields the record does not hold
// (written by an earlier release) are empty ("" or 0).
type idemJSON struct {
	Route         string `json:"route"`
	EventID       string `json:"event_id"`
	State         string `json:"state"`
	Subject       string `json:"subject"`
	PayloadSHA256 string `json:"payload_sha256"`
	Written       string `json:"written"` // RFC 3339, UTC
	Host          string `json:"host"`
	PID           int    `json:"pid"`
	Stream        string `json:"stream"`
	Seq           uint64 `json:"seq"`
	Delivered     uint64 `json:"delivered"`
	Bucket        string `json:"bucket"`
	Key           string `json:"key"`
	Revision      uint64 `json:"revision"`
	Forgotten     bool   `json:"forgotten,omitempty"` // idem forget: removed
}

func recordJSON(bucket string, r idempotency.Record) idemJSON {
	return idemJSON{Route: r.Route, EventID: r.EventID, State: string(r.State), Subject: r.Subject, PayloadSHA256: r.Digest,
		Written: r.Written.UTC().Format(time.RFC3339Nano), Host: r.Host, PID: r.PID, Stream: r.Stream, Seq: r.Seq,
		Delivered: r.Delivered, Bucket: bucket, Key: r.Key, Revision: r.Revision}
}

// orUnknown is a record field as the text output shows it.
func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return shown(s)
}

// printRecord prints one record for reading, its subject escaped.
func printRecord(w io.Writer, bucket string, r idempotency.Record) {
	replica := "unknown"
	if r.PID != 0 {
		replica = fmt.Sprintf("host %s, pid %d", r.Host, r.PID)
	}
	digest := "unknown"
	if r.Digest != "" {
		digest = "sha256:" + r.Digest
	}
	fmt.Fprintf(w, "event %s on route %s\n", shown(r.EventID), r.Route)
	fmt.Fprintf(w, "  state:    %s\n", r.State)
	fmt.Fprintf(w, "  subject:  %s\n", orUnknown(r.Subject))
	fmt.Fprintf(w, "  payload:  %s\n", digest)
	fmt.Fprintf(w, "  written:  %s\n", r.Written.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(w, "  replica:  %s\n", replica)
	fmt.Fprintf(w, "  message:  %s seq %d, delivery %d\n", shown(r.Stream), r.Seq, r.Delivered)
	fmt.Fprintf(w, "  key:      %s (bucket %s, revision %d)\n", r.Key, bucket, r.Revision)
}

// notFound is the error of an event id without a record on routes.
func notFound(eventID string, routes []string) error {
	where := "route " + routes[0]
	if len(routes) > 1 {
		where = "routes " + strings.Join(routes, ", ")
	}
	return &exitError{Code: 1, Msg: fmt.Sprintf("no idempotency record of event %s on %s", shown(eventID), where)}
}

func newIdemShowCmd() *cobra.Command {
	var o idemOptions
	c := &cobra.Command{
		Use:   "show EVENT_ID",
		Short: "one event's idempotency record: state, subject, payload digest, when, which replica",
		Long: `Show the idempotency record of EVENT_ID on --route, else on every route
with idempotency: true (one record per route that has one): its state
(inflight or done), the subject and payload SHA-256 it was taken for, when
it was written, which replica wrote it (host and process id; "unknown" for
a record written by 0.1.0 or earlier), and the message that took it. No
record on any route: exit 1. With --json, one object per record with the
keys route, event_id, state, subject, payload_sha256, written, host, pid
(empty or 0 when unknown), stream, seq, delivered, bucket, key, revision.`,
		Example: `  bridge idem show --config config/sotercare.yaml fall-8
  bridge idem show --config config/sotercare.yaml fall-8 --route caregiver-alerts --json`,
	}
	return idemCommand(c, &o, func([]string) error { return nil }, func(ctx context.Context, s *idemSession, eventID string, c *cobra.Command) error {
		routes := s.routes
		if o.route != "" {
			routes = []string{o.route}
		}
		stdout := c.OutOrStdout()
		found := 0
		for _, route := range routes {
			r, err := s.store.Get(ctx, route, eventID)
			if errors.Is(err, idempotency.ErrNotFound) {
				continue
			}
			if err != nil {
				return idemErr(err)
			}
			if o.asJSON {
				if err := cli.WriteJSON(stdout, recordJSON(s.store.Bucket(), r)); err != nil {
					return err
				}
			} else {
				if found > 0 {
					fmt.Fprintln(stdout)
				}
				printRecord(stdout, s.store.Bucket(), r)
			}
			found++
		}
		if found == 0 {
			return notFound(eventID, routes)
		}
		return nil
	})
}

func newIdemForgetCmd() *cobra.Command {
	var o idemOptions
	var yes bool
	c := &cobra.Command{
		Use:   "forget EVENT_ID --route R",
		Short: "remove one event's idempotency record (asks first, or --yes)",
		Long: `Remove the idempotency record of EVENT_ID on --route: the next message with
this event id on that route is delivered as a new event. This is how an
event-id-conflict is cleared: forget the record, then replay the dead letter
with --include event-id-conflict. Check first with "idem show" and
"dlq show" that the dead letter is the event you want delivered.

It prints the record and asks for confirmation on a terminal; --yes skips
the question, and is required when stdin is not a terminal. The record is
removed only if it is still the one shown (a delivery that took it
meanwhile: exit 1, nothing removed). No record: exit 1. One audit line goes
to stderr (who, when, what: route, event id, the record's state, revision
and payload digest, the result). With --json: the record as "idem show
--json" prints it, with "forgotten": true.`,
		Example: `  bridge idem forget --config config/sotercare.yaml fall-8 --route caregiver-alerts
  bridge idem forget --config config/sotercare.yaml fall-8 --route caregiver-alerts --yes --json`,
	}
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask")
	return idemCommand(c, &o, func([]string) error {
		if o.route == "" {
			return usageErr("idem forget needs --route (idem show lists the routes that hold a record)")
		}
		if !yes && !stdinIsTerminal(c.InOrStdin()) {
			return usageErr("idem forget: stdin is not a terminal: give --yes to forget without a question")
		}
		return nil
	}, func(ctx context.Context, s *idemSession, eventID string, c *cobra.Command) error {
		stdout, stderr := c.OutOrStdout(), c.ErrOrStderr()
		a := newAudit("idem forget").field("route", o.route).field("event_id", eventID).field("bucket", s.store.Bucket())
		result := "error"
		defer func() { a.field("result", result).write(stderr) }()
		r, err := s.store.Get(ctx, o.route, eventID)
		if errors.Is(err, idempotency.ErrNotFound) {
			result = "not-found"
			return notFound(eventID, []string{o.route})
		}
		if err != nil {
			return idemErr(err)
		}
		a.field("key", r.Key).field("revision", strconv.FormatUint(r.Revision, 10)).field("state", string(r.State)).field("payload_sha256", r.Digest)
		if !yes {
			printRecord(stderr, s.store.Bucket(), r)
			ok, err := confirm(c.InOrStdin(), stderr, fmt.Sprintf("Forget it? The next message with this event id on route %s is delivered as a new event. [y/N] ", o.route))
			if err != nil || !ok {
				result = "declined"
				return &exitError{Code: 1, Msg: "idem forget: not forgotten"}
			}
		}
		if err := s.store.Forget(ctx, r); err != nil {
			if errors.Is(err, idempotency.ErrChanged) {
				result = "changed"
				return &exitError{Code: 1, Msg: "idem forget: the record changed since it was read (a delivery took it over, finished or released it); nothing removed: run idem show again"}
			}
			return idemErr(err)
		}
		result = "forgotten"
		if o.asJSON {
			j := recordJSON(s.store.Bucket(), r)
			j.Forgotten = true
			return cli.WriteJSON(stdout, j)
		}
		fmt.Fprintf(stdout, "forgot event %s on route %s (was %s, revision %d)\n", shown(eventID), o.route, r.State, r.Revision)
		return nil
	})
}

// stdinIsTerminal reports whether in is a terminal (a prompt can be
// answered).
func stdinIsTerminal(in io.Reader) bool {
	f, ok := in.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// maxAnswer bounds the answer read from a prompt.
const maxAnswer = 64

// confirm asks question on stderr and reads one line from in: true for
// "y" or "yes" (any case), false for anything else, an empty line or end
// of input.
func confirm(in io.Reader, stderr io.Writer, question string) (bool, error) {
	fmt.Fprint(stderr, question)
	line, err := bufio.NewReader(io.LimitReader(in, maxAnswer)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true, nil
	}
	return false, nil
}
