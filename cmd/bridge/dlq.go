package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/time/rate"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/subjects"
)

const dlqUsage = `usage: bridge dlq COMMAND [flags]

commands:
  list    [--route R] [--reason X] [--limit N] [--json]
          one line per dead letter: seq, route, reason, failure, status,
          event id, original subject, failed-at; --json: one object per line
          with keys seq, route, reason, failure, status (0 when no HTTP
          response was obtained), event_id, subject, deliveries, failed_at
  show    SEQ [--payload]
          every header of one dead letter; the payload only with --payload
  replay  (--all | SEQ...) [--route R] [--reason X] [--dry-run] [--rate N] [--keep]
          republish to the original subject, then delete unless --keep;
          "replayed N" counts every republished dead letter, duplicates
          (already replayed within the duplicate window) included. A dead
          letter from another stream, for a subject outside the stream's or
          its route's subjects, for a system, inbox or dead-letter subject,
          or stored without its payload is refused: reported with the
          reason, kept, counted as failed (exit 1); --dry-run shows the same
  purge   (--all | SEQ...) [--route R]
          delete dead letters, without asking

Text from dead letters (subjects, header names and values, payloads) is
printed with control and invisible characters escaped (\x1b, \r, \u202e,
...); a subject, event id or header value is cut at 1 KiB.

Every command takes --config FILE (default $BRIDGE_CONFIG). They connect to
nats.url or, when it is empty, to the running bridge's embedded server on
nats.embedded.listen; they never start a server. SIGINT/SIGTERM stops replay
and purge after the current dead letter (exit 1).
`

// Reasons --reason accepts: a typo would otherwise match nothing silently.
var dlqReasons = []string{bridge.ReasonRejected, bridge.ReasonMaxDeliveries, bridge.ReasonInvalidEvent}

// dlqOpTimeout bounds one replay or delete. It is not cut short by a
// signal: the current dead letter is finished, then the command stops.
const dlqOpTimeout = 30 * time.Second

// progressMin is the number of dead letters from which replay shows a
// progress bar (when stderr is a terminal).
const progressMin = 10

func cmdDLQ(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageErr("dlq needs a command: list, show, replay or purge (see \"bridge dlq help\")")
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "list":
		return dlqList(args, stdout, stderr)
	case "show":
		return dlqShow(args, stdout, stderr)
	case "replay":
		return dlqReplay(args, stdout, stderr)
	case "purge":
		return dlqPurge(args, stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, dlqUsage)
		return nil
	}
	return usageErr("dlq: unknown command %q (want list, show, replay or purge)", cmd)
}

// dlqSession is one dlq command's connection to the dead-letter stream.
type dlqSession struct {
	cfg     *config.Config
	nc      *nats.Conn
	closing *atomic.Bool // set before a deliberate close: no "reconnecting" log
	q       *bridge.DLQ
}

// openDLQ loads the configuration and connects, without ever starting an
// embedded server: the dlq commands work on the running bridge's JetStream.
func openDLQ(path string, stderr io.Writer) (*dlqSession, error) {
	cfg, err := loadConfig(path, stderr)
	if err != nil {
		return nil, err
	}
	closing := new(atomic.Bool)
	nc, js, err := dialNATS(cfg, closing, stderr)
	if err != nil {
		return nil, err
	}
	return &dlqSession{cfg: cfg, nc: nc, closing: closing, q: bridge.OpenDLQ(js, cfg)}, nil
}

func (s *dlqSession) close() {
	s.closing.Store(true)
	s.nc.Close()
}

// dlqURL is the server the dlq commands connect to: nats.url, else the
// embedded server that a running bridge serves on nats.embedded.listen
// (an unspecified listen host is reached on loopback). shown is the URL
// for messages, without credentials.
func dlqURL(cfg *config.Config) (url, shown string, err error) {
	if !cfg.Embedded() {
		return cfg.NATS.URL.Value(), cfg.NATS.URL.RedactedURL(), nil
	}
	host, port, err := net.SplitHostPort(cfg.NATS.Embedded.Listen)
	if err != nil {
		return "", "", &exitError{code: 2, msg: fmt.Sprintf("nats.embedded.listen: must be host:port, got %q", cfg.NATS.Embedded.Listen)}
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	url = "nats://" + net.JoinHostPort(host, port)
	return url, url, nil
}

// dialNATS connects with the configuration's credentials and TLS.
func dialNATS(cfg *config.Config, closing *atomic.Bool, stderr io.Writer) (*nats.Conn, jetstream.JetStream, error) {
	url, shown, err := dlqURL(cfg)
	if err != nil {
		return nil, nil, err
	}
	log := zerolog.New(zerolog.ConsoleWriter{Out: stderr, NoColor: true, TimeFormat: time.RFC3339}).
		Level(zerolog.WarnLevel).With().Timestamp().Logger()
	opts, err := natsOptions(cfg.NATS, log, closing)
	if err != nil {
		return nil, nil, &exitError{code: 2, msg: err.Error()}
	}
	// A command fails at once when nothing answers, unlike the daemon,
	// which waits for its broker.
	opts = append(opts, nats.RetryOnFailedConnect(false))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		if cfg.Embedded() {
			return nil, nil, fmt.Errorf("connect to the bridge's embedded JetStream at %s (nats.embedded.listen; is the bridge running?): %w", shown, err)
		}
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w", shown, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		closing.Store(true)
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// dlqErr makes a library error a command error, with a hint for a missing
// dead-letter stream.
func dlqErr(s *dlqSession, err error) error {
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("dead-letter stream %s does not exist (has the bridge run with this configuration?)", s.cfg.DeadLetter.Stream)
	}
	if errors.Is(err, context.Canceled) {
		return &exitError{code: 1, msg: "interrupted"}
	}
	return errors.New(errText(err))
}

// errText drops the "bridge: " that library errors start with: the
// command prints its own.
func errText(err error) string { return strings.TrimPrefix(err.Error(), "bridge: ") }

// signalContext is cancelled by SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// filterFlags registers --route and, when withReason, --reason.
func filterFlags(fs *flag.FlagSet, withReason bool) (route, reason *string) {
	route = fs.String("route", "", "only dead letters of this route")
	reason = new(string)
	if withReason {
		reason = fs.String("reason", "", "only dead letters with this reason: "+strings.Join(dlqReasons, ", "))
	}
	return route, reason
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

func failedAt(d bridge.DLQMessage) string {
	if d.FailedAt.IsZero() {
		return ""
	}
	return d.FailedAt.Format(time.RFC3339)
}

func dlqList(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dlq list", stderr)
	path := configFlag(fs)
	route, reason := filterFlags(fs, true)
	limit := fs.Int("limit", 0, "at most N dead letters (0: all)")
	asJSON := fs.Bool("json", false, "one JSON object per line")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr("dlq list takes no arguments, got %q", pos[0])
	}
	if *limit < 0 {
		return usageErr("dlq list: --limit must be >= 0, got %d", *limit)
	}
	if err := checkFilter("dlq list", *route, *reason); err != nil {
		return err
	}
	s, err := openDLQ(*path, stderr)
	if err != nil {
		return err
	}
	defer s.close()
	ctx, stop := signalContext()
	defer stop()

	ds, err := s.q.List(ctx, bridge.DLQFilter{Route: *route, Reason: *reason, Limit: *limit}, false)
	if err != nil {
		return dlqErr(s, err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetEscapeHTML(false)
		for _, d := range ds {
			if err := enc.Encode(dlqLine{
				Seq: d.Seq, Route: d.Route, Reason: d.Reason, Failure: d.Failure, Status: d.Status,
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
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Seq, cell(d.Route), cell(d.Reason), cell(d.Failure),
			status, cell(d.EventID), cell(d.Subject), cell(failedAt(d)))
	}
	return tw.Flush()
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
// before it reaches a terminal (see the README's Security section): a
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
	var refused *bridge.ReplayRefusedError
	if errors.As(err, &refused) {
		return fmt.Sprintf("bridge: dead letter %d refused (subject %s): %s", refused.Seq, cell(refused.Subject), shown(refused.Reason))
	}
	return "bridge: " + shown(errText(err))
}

func dlqShow(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dlq show", stderr)
	path := configFlag(fs)
	payload := fs.Bool("payload", false, "also print the payload (indented when it is JSON)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr("dlq show takes exactly one SEQ, got %d arguments", len(pos))
	}
	seqs, err := parseSeqs("dlq show", pos)
	if err != nil {
		return err
	}
	s, err := openDLQ(*path, stderr)
	if err != nil {
		return err
	}
	defer s.close()
	ctx, stop := signalContext()
	defer stop()

	d, err := s.q.Get(ctx, seqs[0])
	if err != nil {
		return dlqErr(s, err)
	}
	fmt.Fprintf(stdout, "dead letter %d on %s\nsubject: %s\nstored:  %s\n\nheaders:\n", d.Seq, s.q.Stream(), shown(d.DLQSubject), d.Stored.UTC().Format(time.RFC3339Nano))
	keys := make([]string, 0, len(d.Header))
	for k := range d.Header {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range d.Header[k] {
			fmt.Fprintf(stdout, "  %s: %s\n", shown(k), shown(v))
		}
	}
	if !*payload {
		fmt.Fprintf(stdout, "\npayload: %d bytes (--payload to print it)\n", len(d.Data))
		return nil
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
	_, err = io.WriteString(stdout, out)
	return err
}

// selection is the dead letters a replay or purge works on.
type selection struct {
	ds     []bridge.DLQMessage
	failed int // SEQs that could not be read
}

// selectDeadLetters lists the dead letters f selects (--all) or reads each
// SEQ; a SEQ that is missing is reported and counted, one outside the
// filter is reported and skipped.
func selectDeadLetters(ctx context.Context, s *dlqSession, all bool, seqs []uint64, f bridge.DLQFilter, stderr io.Writer) (selection, error) {
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
		case errors.Is(err, bridge.ErrDeadLetterNotFound):
			fmt.Fprintln(stderr, failLine(err))
			sel.failed++
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
	if n < progressMin || !isTerminal(stderr) {
		return progress{}
	}
	p := progress{stderr: stderr, clear: isTerminal(stdout)}
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

func dlqReplay(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dlq replay", stderr)
	path := configFlag(fs)
	route, reason := filterFlags(fs, true)
	all := fs.Bool("all", false, "every dead letter (that --route and --reason select)")
	dryRun := fs.Bool("dry-run", false, "print what would be replayed; change nothing")
	perSec := fs.Float64("rate", 0, "at most N republishes per second (0: no limit)")
	keep := fs.Bool("keep", false, "leave the dead letters on the dead-letter stream")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	seqs, err := selectionArgs("dlq replay", *all, pos)
	if err != nil {
		return err
	}
	if *perSec < 0 {
		return usageErr("dlq replay: --rate must be >= 0, got %g", *perSec)
	}
	if err := checkFilter("dlq replay", *route, *reason); err != nil {
		return err
	}
	s, err := openDLQ(*path, stderr)
	if err != nil {
		return err
	}
	defer s.close()
	ctx, stop := signalContext()
	defer stop()

	sel, err := selectDeadLetters(ctx, s, *all, seqs, bridge.DLQFilter{Route: *route, Reason: *reason}, stderr)
	if err != nil {
		return err
	}
	failed := sel.failed
	if *dryRun {
		n := 0
		for _, d := range sel.ds {
			// The same guard as the replay itself: every refusal shows.
			if err := s.q.CheckReplay(d); err != nil {
				fmt.Fprintln(stderr, failLine(err))
				failed++
				continue
			}
			fmt.Fprintf(stdout, "would replay %d %s -> %s\n", d.Seq, shown(d.EventID), shown(d.Subject))
			n++
		}
		fmt.Fprintf(stdout, "dry run: would replay %d, failed %d; nothing changed\n", n, failed)
		if failed > 0 {
			return &exitError{code: 1}
		}
		return nil
	}

	var lim *rate.Limiter
	if *perSec > 0 {
		lim = rate.NewLimiter(rate.Limit(*perSec), 1)
	}
	bar := newProgress(stdout, stderr, len(sel.ds), "replaying")
	var replayed, dups, kept, done int
	interrupted := false
	for _, d := range sel.ds {
		if ctx.Err() != nil {
			interrupted = true
			break
		}
		if lim != nil {
			if err := lim.Wait(ctx); err != nil {
				interrupted = true
				break
			}
		}
		// The current dead letter is finished even after a signal.
		opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dlqOpTimeout)
		res, err := s.q.Replay(opCtx, d.Seq, *keep)
		cancel()
		done++
		if err != nil {
			bar.println(stderr, failLine(err))
			bar.add()
			failed++
			continue
		}
		replayed++
		line := fmt.Sprintf("replayed %d %s -> %s stream=%s seq=%d", res.Seq, shown(res.EventID), shown(res.Subject), shown(res.Stream), res.StreamSeq)
		if res.Duplicate {
			dups++
			line += " (duplicate)"
		}
		if res.Kept {
			kept++
			line += " (kept)"
		}
		bar.println(stdout, line)
		bar.add()
	}
	bar.done()
	fmt.Fprintf(stdout, "replayed %d, duplicates %d, kept %d, failed %d\n", replayed, dups, kept, failed)
	if interrupted {
		return &exitError{code: 1, msg: fmt.Sprintf("dlq replay: interrupted after %d of %d dead letters", done, len(sel.ds))}
	}
	if failed > 0 {
		return &exitError{code: 1}
	}
	return nil
}

func dlqPurge(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dlq purge", stderr)
	path := configFlag(fs)
	route, _ := filterFlags(fs, false)
	all := fs.Bool("all", false, "every dead letter (of --route)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	seqs, err := selectionArgs("dlq purge", *all, pos)
	if err != nil {
		return err
	}
	if err := checkFilter("dlq purge", *route, ""); err != nil {
		return err
	}
	s, err := openDLQ(*path, stderr)
	if err != nil {
		return err
	}
	defer s.close()
	ctx, stop := signalContext()
	defer stop()

	// Only what was listed is deleted: a dead letter stored meanwhile
	// stays (a stream purge by subject would take it unseen).
	sel, err := selectDeadLetters(ctx, s, *all, seqs, bridge.DLQFilter{Route: *route}, stderr)
	if err != nil {
		return err
	}
	failed, deleted, interrupted := sel.failed, 0, false
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
			continue
		}
		deleted++
		fmt.Fprintf(stdout, "deleted %d\n", d.Seq)
	}
	fmt.Fprintf(stdout, "deleted %d, failed %d\n", deleted, failed)
	if interrupted {
		return &exitError{code: 1, msg: fmt.Sprintf("dlq purge: interrupted after %d of %d dead letters", deleted+failed-sel.failed, len(sel.ds))}
	}
	if failed > 0 {
		return &exitError{code: 1}
	}
	return nil
}
