package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/time/rate"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/cli"
	"github.com/sotercare/jetbridge/internal/embedded"
	"github.com/sotercare/jetbridge/subjects"
)

const dlqLong = `List, inspect, replay and purge the dead letters on the dead-letter stream
(dead_letter.stream, default EVENTS_DLQ).

The commands connect to NATS in this order: --server, nats.url, $NATS_URL,
else the embedded store (nats.embedded): through the running bridge's server
on nats.embedded.listen, or, when no bridge runs, directly: the command
locks nats.embedded.store_dir as bridge run does and serves it privately
(no port opened) until it ends, so a bridge started later delivers what was
replayed. While another process holds the store and nothing answers on
nats.embedded.listen, the commands refuse (exit 1).
Reading consumes nothing. Text from dead letters
(subjects, header names and values, payloads) is printed with control and
invisible characters escaped (\x1b, \r, \u202e, ...); a subject, event id
or header value is cut at 1 KiB. SIGINT/SIGTERM stops replay and purge
after the current dead letter (exit 1).`

const dlqExample = `  bridge dlq list --config config/quickstart.yaml
  bridge dlq show --config config/quickstart.yaml 2 --payload
  bridge dlq replay --config config/quickstart.yaml --all --dry-run
  bridge dlq purge --config config/quickstart.yaml --all --route all-events`

func newDLQCmd() *cobra.Command {
	c := &cobra.Command{Use: "dlq", Short: "list, show, replay or purge dead letters", Long: dlqLong, Example: dlqExample}
	cli.Group(c)
	c.AddCommand(newDLQListCmd(), newDLQShowCmd(), newDLQReplayCmd(), newDLQPurgeCmd())
	return c
}

// dlqOptions are the flags every dlq command shares.
type dlqOptions struct {
	config, server string
	route, reason  string
}

// The filter flags a dlq command takes.
type dlqFilters int

const (
	noFilter       dlqFilters = iota
	routeFilter               // --route
	routeAndReason            // --route and --reason
)

// dlqCommand is the one setup of the dlq commands: --config, --server and
// the filter flags registered; on run, the filter
// checked, then check (the command's own argument checks, bad usage
// before any connection), then the configuration loaded and the
// connection opened; work gets the session and a context that SIGINT and
// SIGTERM cancel, and the session is closed after it.
func dlqCommand(c *cobra.Command, o *dlqOptions, filters dlqFilters, check func(args []string) error,
	work func(ctx context.Context, s *dlqSession, stdout, stderr io.Writer) error) *cobra.Command {
	f := c.Flags()
	configFlag(f, &o.config)
	serverFlag(f, &o.server)
	if filters >= routeFilter {
		f.StringVar(&o.route, "route", "", "only dead letters of this route")
	}
	if filters >= routeAndReason {
		f.StringVar(&o.reason, "reason", "", "only dead letters with this reason: "+strings.Join(dlqReasons, ", "))
	}
	name := "dlq " + strings.Fields(c.Use)[0]
	c.RunE = func(c *cobra.Command, args []string) error {
		if err := checkFilter(name, o.route, o.reason); err != nil {
			return err
		}
		if err := check(args); err != nil {
			return err
		}
		stdout, stderr := c.OutOrStdout(), c.ErrOrStderr()
		// Signals are caught from before the connection: one that comes
		// while a stopped bridge's store is being opened still lets the
		// private server shut down cleanly (dlqconn.go).
		ctx, stop := signalContext()
		defer stop()
		s, err := openDLQ(o.config, o.server, stderr)
		if err != nil {
			return err
		}
		defer s.close()
		return work(ctx, s, stdout, stderr)
	}
	return c
}

// Reasons --reason accepts: a typo would otherwise match nothing silently.
var dlqReasons = func() []string {
	rs := make([]string, len(deadletter.Reasons))
	for i, r := range deadletter.Reasons {
		rs[i] = string(r)
	}
	return rs
}()

// dlqOpTimeout bounds one replay or delete. It is not cut short by a
// signal: the current dead letter is finished, then the command stops.
const dlqOpTimeout = 30 * time.Second

// progressMin is the number of dead letters from which replay shows a
// progress bar (when stderr is a terminal).
const progressMin = 10

// dlqSession is one dlq command's connection to the dead-letter stream.
type dlqSession struct {
	cfg     *config.Config
	nc      *nats.Conn
	js      jetstream.JetStream // on nc
	closing *atomic.Bool        // set before a deliberate close: no "reconnecting" log
	q       *deadletter.Queue
	srv     *embedded.Server // the stopped bridge's store, served privately (dlqconn.go); nil otherwise
}

// dlqText is the text of an error of package deadletter (or bridge) as
// the commands print it after their own "bridge: ": without the package's
// prefix.
func dlqText(err error) string {
	return strings.TrimPrefix(errText(err), "deadletter: ")
}

// dlqErr makes a library error a command error, with a hint for a missing
// dead-letter stream.
func dlqErr(s *dlqSession, err error) error {
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("dead-letter stream %s does not exist (has the bridge run with this configuration?)", s.cfg.DeadLetter.Stream)
	}
	if errors.Is(err, context.Canceled) {
		return &exitError{Code: 1, Msg: "interrupted"}
	}
	return errors.New(dlqText(err))
}

func checkFilter(name, route, reason string) error {
	if route != "" && subjects.ValidateToken(route) != nil {
		return usageErr("%s: --route %q is not a route name", name, route)
	}
	if reason != "" && !slices.Contains(dlqReasons, reason) {
		return usageErr("%s: --reason %q is not one of %s", name, reason, strings.Join(dlqReasons, ", "))
	}
	return nil
}

// parseSeqs reads SEQ arguments: positive integers.
func parseSeqs(name string, pos []string) ([]uint64, error) {
	seqs := make([]uint64, 0, len(pos))
	for _, p := range pos {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil || n == 0 {
			return nil, usageErr("%s: SEQ %q is not a positive integer", name, p)
		}
		seqs = append(seqs, n)
	}
	return seqs, nil
}

// dlqLine is one dead letter of "dlq list --json".
type dlqLine struct {
	Seq        uint64 `json:"seq"`
	Route      string `json:"route"`
	Reason     string `json:"reason"`
	Failure    string `json:"failure"`
	Status     int    `json:"status"` // 0: no HTTP response was obtained
	EventID    string `json:"event_id"`
	Subject    string `json:"subject"`
	Deliveries uint64 `json:"deliveries"`
	FailedAt   string `json:"failed_at"` // RFC 3339, "" when unknown
}

func failedAt(d deadletter.Message) string {
	if d.FailedAt.IsZero() {
		return ""
	}
	return d.FailedAt.Format(time.RFC3339)
}

func newDLQListCmd() *cobra.Command {
	var o dlqOptions
	var limit int
	var asJSON bool
	c := &cobra.Command{
		Use:   "list",
		Short: "one line per dead letter",
		Long: `List dead letters, oldest first: seq, route, reason, failure, status, event id,
original subject, failed-at. A filter that matches nothing prints nothing
and exits 0. With --json, one object per line with the keys seq, route,
reason, failure, status (0 when no HTTP response was obtained), event_id,
subject, deliveries, failed_at.`,
		Example: `  bridge dlq list --config config/quickstart.yaml
  bridge dlq list --config config/quickstart.yaml --reason rejected --limit 10 --json`,
	}
	c.Flags().IntVar(&limit, "limit", 0, "at most N dead letters (0: all)")
	c.Flags().BoolVar(&asJSON, "json", false, "one JSON object per line")
	return dlqCommand(c, &o, routeAndReason, func(args []string) error {
		if err := cli.NoArgs(c, args); err != nil {
			return usageErr("dlq list takes no arguments, got %q", args[0])
		}
		if limit < 0 {
			return usageErr("dlq list: --limit must be >= 0, got %d", limit)
		}
		return nil
	}, func(ctx context.Context, s *dlqSession, stdout, stderr io.Writer) error {
		ds, err := s.q.List(ctx, deadletter.Filter{Route: o.route, Reason: deadletter.Reason(o.reason), Limit: limit}, false)
		if err != nil {
			return dlqErr(s, err)
		}
		if asJSON {
			for _, d := range ds {
				if err := cli.WriteJSON(stdout, dlqLine{
					Seq: d.Seq, Route: d.Route, Reason: string(d.Reason), Failure: string(d.Failure), Status: d.Status,
					EventID: d.EventID, Subject: d.Subject, Deliveries: d.Deliveries, FailedAt: failedAt(d),
				}); err != nil {
					return err
				}
			}
			return nil
		}
		if len(ds) == 0 {
			fmt.Fprintln(stderr, "no dead letters")
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "SEQ\tROUTE\tREASON\tFAILURE\tSTATUS\tEVENT ID\tSUBJECT\tFAILED AT")
		for _, d := range ds {
			status := "-"
			if d.Status != 0 {
				status = strconv.Itoa(d.Status)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Seq, cell(d.Route), cell(string(d.Reason)), cell(string(d.Failure)),
				status, cell(d.EventID), cell(d.Subject), cell(failedAt(d)))
		}
		return tw.Flush()
	})
}

// cell is a table cell: "-" when empty, else the value as shown.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	return shown(s)
}

// maxShown bounds what is printed of one value from a dead letter (a
// header value, an event id, a subject): dead letters are untrusted.
const maxShown = 1024

// shown is a value from a dead letter as printed: at most maxShown bytes
// (then "…" and the full size), escaped by escapeTerminal.
func shown(s string) string {
	if len(s) <= maxShown {
		return escapeTerminal(s)
	}
	cut := maxShown
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return escapeTerminal(s[:cut]) + fmt.Sprintf("… (%d bytes)", len(s))
}

// escapeTerminal is the one escaping of text that came from a dead letter
// before it reaches a terminal (see docs/security.md): a
// crafted header, subject or payload could otherwise clear the screen,
// move the cursor, rewrite earlier lines or hide text. Newline, carriage
// return and tab become \n, \r and \t; other C0 controls, DEL and bytes
// that are not valid UTF-8 become \xNN; any other rune that is not
// printable (C1 controls, invisible format characters such as bidi
// overrides, non-ASCII spaces) becomes \uNNNN or \UNNNNNNNN. Backslashes
// are kept as they are, so JSON stays readable; the output is for reading,
// not for decoding (dlq list --json has the exact values).
func escapeTerminal(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c >= 0x7f {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < ' ' || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unicode.IsPrint(r):
			b.WriteRune(r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
		i += n
	}
	return b.String()
}

// escapeLines escapes multi-line text (a payload) line by line, keeping
// its line breaks.
func escapeLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = escapeTerminal(l)
	}
	return strings.Join(lines, "\n")
}

// failLine is the stderr line for one dead letter that could not be
// replayed or deleted: the error and, for a refusal, the subject it
// named, escaped.
func failLine(err error) string {
	var refused *deadletter.ReplayRefusedError
	if errors.As(err, &refused) {
		return fmt.Sprintf("bridge: dead letter %d refused (subject %s): %s", refused.Seq, cell(refused.Subject), shown(refused.Reason))
	}
	return "bridge: " + shown(dlqText(err))
}

// dlqShowJSON is the output of dlq show --json: the exact values (not
// escaped), the payload only with --payload.
type dlqShowJSON struct {
	Seq        uint64              `json:"seq"`
	Stream     string              `json:"stream"`
	Subject    string              `json:"subject"` // on the dead-letter stream
	Stored     string              `json:"stored"`
	Headers    map[string][]string `json:"headers"`
	PayloadLen int                 `json:"payload_bytes"`
	Payload    *string             `json:"payload,omitempty"`
}

func newDLQShowCmd() *cobra.Command {
	var o dlqOptions
	var payload, asJSON bool
	var seq uint64
	c := &cobra.Command{
		Use:   "show SEQ",
		Short: "every header of one dead letter; the payload with --payload",
		Long: `Show one dead letter: its subject on the dead-letter stream, when it was
stored, and every header, sorted. The payload only with --payload (indented
when it is JSON). SEQ is the dead letter's sequence, as dlq list prints it.
With --json: {"seq","stream","subject","stored","headers","payload_bytes"}
and "payload" (as a string) with --payload.`,
		Example: `  bridge dlq show --config config/quickstart.yaml 2
  bridge dlq show --config config/quickstart.yaml 2 --payload --json | jq -r .payload`,
	}
	c.Flags().BoolVar(&payload, "payload", false, "also print the payload (indented when it is JSON)")
	c.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return dlqCommand(c, &o, noFilter, func(args []string) error {
		if len(args) != 1 {
			return usageErr("dlq show takes exactly one SEQ, got %d arguments", len(args))
		}
		seqs, err := parseSeqs("dlq show", args)
		if err == nil {
			seq = seqs[0]
		}
		return err
	}, func(ctx context.Context, s *dlqSession, stdout, _ io.Writer) error {
		d, err := s.q.Get(ctx, seq)
		if err != nil {
			return dlqErr(s, err)
		}
		if asJSON {
			out := dlqShowJSON{Seq: d.Seq, Stream: s.q.Stream(), Subject: d.DLQSubject,
				Stored: d.Stored.UTC().Format(time.RFC3339Nano), Headers: d.Header, PayloadLen: len(d.Data)}
			if payload {
				p := string(d.Data)
				out.Payload = &p
			}
			return cli.WriteJSON(stdout, out)
		}
		printDeadLetter(stdout, s.q.Stream(), d, payload)
		return nil
	})
}

// printDeadLetter prints one dead letter for reading, every text from it
// escaped.
func printDeadLetter(stdout io.Writer, stream string, d deadletter.Message, payload bool) {
	fmt.Fprintf(stdout, "dead letter %d on %s\nsubject: %s\nstored:  %s\n\nheaders:\n", d.Seq, stream, shown(d.DLQSubject), d.Stored.UTC().Format(time.RFC3339Nano))
	for _, k := range slices.Sorted(maps.Keys(d.Header)) {
		for _, v := range d.Header[k] {
			fmt.Fprintf(stdout, "  %s: %s\n", shown(k), shown(v))
		}
	}
	if !payload {
		fmt.Fprintf(stdout, "\npayload: %d bytes (--payload to print it)\n", len(d.Data))
		return
	}
	// The payload is escaped like every other text from a dead letter,
	// whether or not stdout is a terminal: show is for reading.
	fmt.Fprintf(stdout, "\npayload (%d bytes):\n", len(d.Data))
	text := d.Data
	var pretty bytes.Buffer
	if json.Valid(d.Data) && json.Indent(&pretty, d.Data, "", "  ") == nil {
		text = pretty.Bytes()
	}
	out := escapeLines(string(text))
	if out != "" && !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	_, _ = io.WriteString(stdout, out)
}

// selection is the dead letters a replay or purge works on.
type selection struct {
	ds      []deadletter.Message
	failed  int      // SEQs that could not be read
	missing []uint64 // those of them that were not found
}

// selectDeadLetters lists the dead letters f selects (--all) or reads each
// SEQ; a SEQ that is missing is reported and counted, one outside the
// filter is reported and skipped.
func selectDeadLetters(ctx context.Context, s *dlqSession, all bool, seqs []uint64, f deadletter.Filter, stderr io.Writer) (selection, error) {
	if all {
		ds, err := s.q.List(ctx, f, false)
		if err != nil {
			return selection{}, dlqErr(s, err)
		}
		return selection{ds: ds}, nil
	}
	var sel selection
	for _, seq := range seqs {
		d, err := s.q.Get(ctx, seq)
		switch {
		case errors.Is(err, deadletter.ErrNotFound):
			fmt.Fprintln(stderr, failLine(err))
			sel.failed++
			sel.missing = append(sel.missing, seq)
			continue
		case err != nil:
			return selection{}, dlqErr(s, err)
		}
		if !f.Match(d) {
			fmt.Fprintf(stderr, "bridge: dead letter %d skipped: it does not match --route/--reason\n", seq)
			continue
		}
		d.Data = nil
		sel.ds = append(sel.ds, d)
	}
	return sel, nil
}

// selectionFlags registers --all and validates "--all xor SEQ...".
func selectionArgs(name string, all bool, pos []string) ([]uint64, error) {
	switch {
	case all && len(pos) > 0:
		return nil, usageErr("%s: give --all or SEQs, not both", name)
	case !all && len(pos) == 0:
		return nil, usageErr("%s needs --all or at least one SEQ", name)
	}
	return parseSeqs(name, pos)
}

// progress is a progress bar on stderr, or nothing.
type progress struct {
	bar    *progressbar.ProgressBar
	stderr io.Writer
	clear  bool // stdout is a terminal too: clear the bar before each line
}

func newProgress(stdout, stderr io.Writer, n int, what string) progress {
	if n < progressMin || !cli.IsTerminal(stderr) {
		return progress{}
	}
	p := progress{stderr: stderr, clear: cli.IsTerminal(stdout)}
	throttle := 100 * time.Millisecond
	if p.clear {
		throttle = 0 // redrawn after every line, or it would stay cleared
	}
	p.bar = progressbar.NewOptions(n,
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionSetDescription(what),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("msg"),
		progressbar.OptionThrottle(throttle),
	)
	_ = p.bar.RenderBlank()
	return p
}

// println prints a result line without tearing the bar when both go to
// the same terminal.
func (p progress) println(w io.Writer, line string) {
	if p.bar != nil && (p.clear || w == p.stderr) {
		_ = p.bar.Clear()
	}
	fmt.Fprintln(w, line)
}

func (p progress) add() {
	if p.bar != nil {
		_ = p.bar.Add(1)
	}
}

// done removes the bar, leaving the terminal to the count line; an
// interrupted run's bar is not shown as full.
func (p progress) done() {
	if p.bar != nil {
		_ = p.bar.Clear()
		_ = p.bar.Exit()
	}
}

// replayLine is one dead letter of dlq replay --json.
type replayLine struct {
	DLQSeq    uint64 `json:"dlq_seq"`
	EventID   string `json:"event_id"`
	Subject   string `json:"subject"`
	Stream    string `json:"stream,omitempty"`
	Seq       uint64 `json:"seq,omitempty"` // on Stream
	Duplicate bool   `json:"duplicate"`
	Kept      bool   `json:"kept"`
	DryRun    bool   `json:"dry_run,omitempty"`
	// Collision: the stream answered "duplicate" for a message that is not
	// this dead letter's replay (Stream and Seq name it); nothing stored.
	Collision bool   `json:"collision,omitempty"`
	Error     string `json:"error,omitempty"` // not replayed: why
	// Skipped: the reason (invalid-event, event-id-conflict) that makes
	// the dead letter permanent for its payload; not replayed, kept.
	Skipped string `json:"skipped,omitempty"`
}

// replaySummary is the last line of dlq replay --json.
type replaySummary struct {
	Summary struct {
		Replayed   int  `json:"replayed"`
		Duplicates int  `json:"duplicates"`
		Kept       int  `json:"kept"`
		Failed     int  `json:"failed"`
		Skipped    int  `json:"skipped"`
		DryRun     bool `json:"dry_run"`
	} `json:"summary"`
}

func newDLQReplayCmd() *cobra.Command {
	var o dlqOptions
	var all, dryRun, keep, asJSON bool
	var perSec float64
	var seqs []uint64
	var include []string
	c := &cobra.Command{
		Use:   "replay (--all | SEQ...)",
		Short: "republish dead letters to their original subject",
		Long: `Republish each selected dead letter to its original subject, then delete it
from the dead-letter stream unless --keep. Select with --all (narrowed by
--route and --reason) or by SEQ. Each line names the dead letter
(dlq_seq=N) and where the event was stored (stream=NAME seq=N); the last
line counts them: "replayed N" includes duplicates (already replayed within
the stream's duplicate window, read back and checked to be this dead
letter's replay). A duplicate of any other message is a collision: reported,
kept, counted as failed (exit 1). A dead letter from another stream, for a
subject outside the stream's or its route's subjects, for a system, inbox or
dead-letter subject, or stored without its payload is refused: reported
with the reason, kept, counted as failed (exit 1); --dry-run shows the
same. A dead letter whose reason is permanent for its payload
(invalid-event, event-id-conflict) is skipped unless --include names its
reason: kept, counted as skipped (exit 0); --dry-run lists each with why.
An event-id-conflict replays once "bridge idem forget" has removed the
record it conflicts with. A progress bar shows on a terminal. One audit
line goes to stderr (who, when, what: filters, counts and sequences).`,
		Example: `  bridge dlq replay --config config/quickstart.yaml --all --dry-run
  bridge dlq replay --config config/quickstart.yaml 2 5 7
  bridge dlq replay --config config/quickstart.yaml --all --reason rejected --rate 50 --keep
  bridge dlq replay --config config/quickstart.yaml 4 --include event-id-conflict`,
	}
	f := c.Flags()
	f.BoolVar(&all, "all", false, "every dead letter (that --route and --reason select)")
	f.BoolVar(&dryRun, "dry-run", false, "print what would be replayed; change nothing")
	f.Float64Var(&perSec, "rate", 0, "at most N republishes per second (0: no limit)")
	f.BoolVar(&keep, "keep", false, "leave the dead letters on the dead-letter stream")
	f.BoolVar(&asJSON, "json", false, `one JSON object per dead letter, then {"summary":{...}}`)
	f.StringArrayVar(&include, "include", nil, "also replay dead letters with this `REASON`, permanent for the payload: "+strings.Join(permanentReasons, ", ")+" (repeatable)")
	return dlqCommand(c, &o, routeAndReason, func(args []string) error {
		var err error
		if seqs, err = selectionArgs("dlq replay", all, args); err != nil {
			return err
		}
		if perSec < 0 {
			return usageErr("dlq replay: --rate must be >= 0, got %g", perSec)
		}
		for _, r := range include {
			if !deadletter.Reason(r).PermanentForPayload() {
				return usageErr("dlq replay: --include %q: only %s are skipped (permanent for the payload)", r, strings.Join(permanentReasons, " and "))
			}
		}
		return nil
	}, func(ctx context.Context, s *dlqSession, stdout, stderr io.Writer) error {
		sel, err := selectDeadLetters(ctx, s, all, seqs, deadletter.Filter{Route: o.route, Reason: deadletter.Reason(o.reason)}, stderr)
		if err != nil {
			return err
		}
		r := replayer{s: s, keep: keep, json: asJSON, stdout: stdout, stderr: stderr, failed: sel.failed, failedSeqs: sel.missing}
		for _, in := range include {
			r.include = append(r.include, deadletter.Reason(in))
		}
		a := newAudit("dlq replay").selection(all, seqs, o.route, o.reason).
			list("include", include).flag("dry_run", dryRun).flag("keep", keep)
		defer func() { r.audit(a).write(stderr) }()
		if dryRun {
			return r.dryRun(sel.ds)
		}
		if perSec > 0 {
			r.lim = rate.NewLimiter(rate.Limit(perSec), 1)
		}
		return r.replay(ctx, sel.ds)
	})
}

// permanentReasons are the reasons replay skips unless --include names
// them (deadletter.Reason.PermanentForPayload).
var permanentReasons = func() []string {
	var rs []string
	for _, r := range deadletter.Reasons {
		if r.PermanentForPayload() {
			rs = append(rs, string(r))
		}
	}
	return rs
}()

// replayer is one run of dlq replay.
type replayer struct {
	s              *dlqSession
	keep, json     bool
	lim            *rate.Limiter
	stdout, stderr io.Writer
	sum            replaySummary
	failed         int
	include        []deadletter.Reason // --include
	// the dead letters' sequences, for the audit line
	replayedSeqs, skippedSeqs, failedSeqs []uint64
}

// audit completes the audit line of the run with its counts and
// sequences.
func (r *replayer) audit(a *audit) *audit {
	s := r.sum.Summary
	return a.count("replayed", s.Replayed).count("duplicates", s.Duplicates).count("kept", s.Kept).
		count("failed", s.Failed).count("skipped", s.Skipped).
		seqs("replayed_seqs", r.replayedSeqs).seqs("skipped_seqs", r.skippedSeqs).seqs("failed_seqs", r.failedSeqs)
}

// skip reports (and counts) a dead letter that the permanent-reason rule
// leaves alone: listed with why on a dry run, else only counted.
func (r *replayer) skip(d deadletter.Message, dry bool) bool {
	var sk *deadletter.SkippedError
	if !errors.As(deadletter.Skip(d, r.include...), &sk) {
		return false
	}
	r.sum.Summary.Skipped++
	r.skippedSeqs = append(r.skippedSeqs, d.Seq)
	switch {
	case r.json:
		_ = cli.WriteJSON(r.stdout, replayLine{DLQSeq: d.Seq, EventID: d.EventID, Subject: d.Subject, Kept: true, DryRun: dry, Skipped: string(sk.Reason)})
	case dry:
		fmt.Fprintf(r.stdout, "would skip dlq_seq=%d id=%s -> %s: reason %s is permanent for the payload (--include %s replays it)\n",
			d.Seq, shown(d.EventID), shown(d.Subject), sk.Reason, sk.Reason)
	}
	return true
}

// skippedNote is the count of skipped dead letters in the text summary
// (nothing when none was).
func (r *replayer) skippedNote() string {
	if r.sum.Summary.Skipped == 0 {
		return ""
	}
	return fmt.Sprintf(", skipped %d", r.sum.Summary.Skipped)
}

func (r *replayer) dryRun(ds []deadletter.Message) error {
	n := 0
	for _, d := range ds {
		if r.skip(d, true) {
			continue
		}
		// The same guard as the replay itself: every refusal shows.
		if err := r.s.q.CheckReplay(d); err != nil {
			r.fail(progress{}, d, err)
			continue
		}
		if r.json {
			_ = cli.WriteJSON(r.stdout, replayLine{DLQSeq: d.Seq, EventID: d.EventID, Subject: d.Subject, DryRun: true})
		} else {
			fmt.Fprintf(r.stdout, "would replay dlq_seq=%d id=%s -> %s\n", d.Seq, shown(d.EventID), shown(d.Subject))
		}
		n++
	}
	r.sum.Summary.Replayed, r.sum.Summary.Failed, r.sum.Summary.DryRun = n, r.failed, true
	if r.json {
		_ = cli.WriteJSON(r.stdout, r.sum)
	} else {
		fmt.Fprintf(r.stdout, "dry run: would replay %d, failed %d%s; nothing changed\n", n, r.failed, r.skippedNote())
	}
	if r.failed > 0 {
		return &exitError{Code: 1}
	}
	return nil
}

// fail reports one dead letter that was not replayed.
func (r *replayer) fail(bar progress, d deadletter.Message, err error) {
	r.failed++
	r.failedSeqs = append(r.failedSeqs, d.Seq)
	bar.println(r.stderr, failLine(err))
	if r.json {
		line := replayLine{DLQSeq: d.Seq, EventID: d.EventID, Subject: d.Subject, Kept: true, Error: dlqText(err)}
		var c *deadletter.ReplayCollisionError
		if errors.As(err, &c) {
			line.Stream, line.Seq, line.Duplicate, line.Collision = c.Stream, c.StreamSeq, true, true
		}
		_ = cli.WriteJSON(r.stdout, line)
	}
}

func (r *replayer) replay(ctx context.Context, ds []deadletter.Message) error {
	bar := newProgress(r.stdout, r.stderr, len(ds), "replaying")
	sum := &r.sum.Summary
	done := 0
	interrupted := false
	for _, d := range ds {
		if ctx.Err() != nil {
			interrupted = true
			break
		}
		if r.lim != nil {
			if err := r.lim.Wait(ctx); err != nil {
				interrupted = true
				break
			}
		}
		if r.skip(d, false) {
			done++
			bar.add()
			continue
		}
		// The current dead letter is finished even after a signal.
		opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dlqOpTimeout)
		res, err := r.s.q.Replay(opCtx, d.Seq, r.keep)
		cancel()
		done++
		if err != nil {
			r.fail(bar, d, err)
			bar.add()
			continue
		}
		sum.Replayed++
		r.replayedSeqs = append(r.replayedSeqs, res.Seq)
		if res.Duplicate {
			sum.Duplicates++
		}
		if res.Kept {
			sum.Kept++
		}
		if r.json {
			_ = cli.WriteJSON(r.stdout, replayLine{DLQSeq: res.Seq, EventID: res.EventID, Subject: res.Subject,
				Stream: res.Stream, Seq: res.StreamSeq, Duplicate: res.Duplicate, Kept: res.Kept})
		} else {
			line := fmt.Sprintf("replayed dlq_seq=%d id=%s -> %s stream=%s seq=%d", res.Seq, shown(res.EventID), shown(res.Subject), shown(res.Stream), res.StreamSeq)
			if res.Duplicate {
				line += " (duplicate)"
			}
			if res.Kept {
				line += " (kept)"
			}
			bar.println(r.stdout, line)
		}
		bar.add()
	}
	bar.done()
	sum.Failed = r.failed
	if r.json {
		_ = cli.WriteJSON(r.stdout, r.sum)
	} else {
		fmt.Fprintf(r.stdout, "replayed %d, duplicates %d, kept %d, failed %d%s\n", sum.Replayed, sum.Duplicates, sum.Kept, sum.Failed, r.skippedNote())
	}
	if sum.Skipped > 0 {
		fmt.Fprintf(r.stderr, "bridge: skipped %d: reason permanent for the payload (%s); --dry-run lists them, --include REASON replays them\n",
			sum.Skipped, strings.Join(permanentReasons, ", "))
	}
	if interrupted {
		return &exitError{Code: 1, Msg: fmt.Sprintf("dlq replay: interrupted after %d of %d dead letters", done, len(ds))}
	}
	if r.failed > 0 {
		return &exitError{Code: 1}
	}
	return nil
}

func newDLQPurgeCmd() *cobra.Command {
	var o dlqOptions
	var all bool
	var seqs []uint64
	c := &cobra.Command{
		Use:   "purge (--all | SEQ...)",
		Short: "delete dead letters, without asking",
		Long: `Delete dead letters: --all (narrowed by --route) or by SEQ. Only what was
listed when the command started is deleted; a dead letter stored meanwhile
stays. It asks nothing and prints each deleted sequence, then a count. One
audit line goes to stderr (who, when, what: filters, counts and sequences).

A dead letter that blocks its key (a route with ordering.on_dead_letter:
block) re-opens the key when it is purged: its block record is deleted and
the key goes on with its next message ("re-opened" lines).`,
		Example: `  bridge dlq purge --config config/quickstart.yaml 4 9
  bridge dlq purge --config config/quickstart.yaml --all --route all-events`,
	}
	c.Flags().BoolVar(&all, "all", false, "every dead letter (of --route)")
	return dlqCommand(c, &o, routeFilter, func(args []string) error {
		var err error
		seqs, err = selectionArgs("dlq purge", all, args)
		return err
	}, func(ctx context.Context, s *dlqSession, stdout, stderr io.Writer) error {
		return purge(ctx, s, all, seqs, o.route, stdout, stderr)
	})
}

// purge deletes the selected dead letters, then writes the audit line.
func purge(ctx context.Context, s *dlqSession, all bool, seqs []uint64, route string, stdout, stderr io.Writer) error {
	// Only what was listed is deleted: a dead letter stored meanwhile
	// stays (a stream purge by subject would take it unseen).
	sel, err := selectDeadLetters(ctx, s, all, seqs, deadletter.Filter{Route: route}, stderr)
	if err != nil {
		return err
	}
	failed, deleted, reopened, interrupted := sel.failed, 0, 0, false
	blocks := newBlockIndex(s)
	var deletedSeqs []uint64
	failedSeqs := sel.missing
	defer func() {
		a := newAudit("dlq purge").selection(all, seqs, route, "").count("deleted", deleted)
		if reopened > 0 { // keys of ordered routes re-opened: only then, the line is as before
			a.count("reopened", reopened)
		}
		a.count("failed", failed).seqs("deleted_seqs", deletedSeqs).seqs("failed_seqs", failedSeqs).write(stderr)
	}()
	for _, d := range sel.ds {
		if ctx.Err() != nil {
			interrupted = true
			break
		}
		opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dlqOpTimeout)
		err := s.q.Delete(opCtx, d.Seq)
		cancel()
		if err != nil {
			fmt.Fprintln(stderr, failLine(err))
			failed++
			failedSeqs = append(failedSeqs, d.Seq)
			continue
		}
		deleted++
		deletedSeqs = append(deletedSeqs, d.Seq)
		fmt.Fprintf(stdout, "deleted %d\n", d.Seq)
		if id, err := blocks.reopen(ctx, d.Route, d.Seq); err != nil {
			fmt.Fprintf(stderr, "bridge: dead letter %d deleted, but its blocked key of route %s not re-opened: %s\n", d.Seq, d.Route, errText(err))
			failed++
			failedSeqs = append(failedSeqs, d.Seq)
		} else if id != "" {
			reopened++
			fmt.Fprintf(stdout, "re-opened key %s of route %s\n", id, d.Route)
		}
	}
	fmt.Fprintf(stdout, "deleted %d, failed %d\n", deleted, failed)
	if interrupted {
		return &exitError{Code: 1, Msg: fmt.Sprintf("dlq purge: interrupted after %d of %d dead letters", deleted+failed-sel.failed, len(sel.ds))}
	}
	if failed > 0 {
		return &exitError{Code: 1}
	}
	return nil
}
