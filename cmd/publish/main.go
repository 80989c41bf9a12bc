// Command publish publishes jetbridge events to NATS JetStream and prints
// what JetStream stored for each one (CONTRACT 1 and 3).
//
// Every event carries its id as Nats-Msg-Id and Event-Id, so publishing the
// same id again inside the stream's duplicate window stores nothing: publish
// reports it as "duplicate", which is not an error. publish only talks to a
// NATS server; it never starts one, and never prints payloads or
// credentials.
//
// Exit codes: 0 every event stored (or refused as a duplicate), 1 runtime
// failure, 2 bad usage.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
)

const usage = `usage: publish [flags] [PAYLOAD]

Publishes one event to NATS JetStream (or many with --jsonl) and prints what
JetStream stored. PAYLOAD is the message data, sent as is with Content-Type
application/json; without PAYLOAD or --file it is {}. Flags may come before
or after PAYLOAD; use -- before a PAYLOAD that starts with "-".

flags:
  --url URL          NATS server (default $NATS_URL, else nats://127.0.0.1:4222)
  --subject S        explicit subject
  --type T           event type, e.g. order.created; without --subject the subject is <root>.<severity>.<type>
  --severity LEVEL   info | warning | critical (default info; with --subject, the subject's severity)
  --root ROOT        subject root (default events)
  --id ID            event id: sent as Nats-Msg-Id and Event-Id (default: a new unique id)
  --meta K=V         event metadata, repeatable (sent as Event-Meta-K)
  --file PATH|-      payload from a file or stdin instead of the argument
  --jsonl PATH|-     many events, one JSON object per line:
                     {"id","type","severity","subject","metadata":{},"payload":<json>}
                     Each line carries its own fields; of the event flags only --root applies
                     (--subject, --type, --severity, --id and --meta are refused). Blank lines
                     are skipped. The first bad line stops publish with exit 1; the events
                     before it stay published.
  --json             print one JSON result per event
  --creds FILE       NATS user credentials file
  --nkey FILE        NKey seed file
  --user USER        user name, with --password PASSWORD
  --token TOKEN      authentication token
  --tls-ca FILE      CA certificates to verify the server
  --tls-cert FILE    client certificate, with --tls-key FILE

output, one line per event:
  stored SUBJECT id=ID stream=NAME seq=N
  duplicate SUBJECT id=ID stream=NAME seq=N    (the id is already stored inside the
                                               stream's duplicate window; seq is the original's)
  with --json: {"id":"ID","subject":"SUBJECT","stream":"NAME","seq":N,"duplicate":false}

exit status: 0 published (duplicates included), 1 runtime failure (no stream captures
the subject, NATS unreachable, a bad --jsonl line), 2 bad usage.

examples:
  publish --type sensor.fall --severity critical --id fall-42 --meta room=12 '{"resident":"r-7"}'
    prints: stored events.critical.sensor.fall id=fall-42 stream=EVENTS seq=1
  publish --subject events.info.order.created --file order.json --json
  publish --jsonl - < events.jsonl
`

// defaultURL is the server when neither --url nor $NATS_URL is set.
const defaultURL = "nats://127.0.0.1:4222"

// defaultPayload is the data of an event given neither PAYLOAD nor --file:
// the smallest JSON document, so envelope destinations accept it.
const defaultPayload = "{}"

// publishTimeout bounds one publish, from the request to JetStream's ack.
const publishTimeout = 10 * time.Second

// usageError is bad usage: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run runs one command line and returns the exit status. Errors go to
// stderr as one line starting "publish: ".
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	err := publish(args, stdin, stdout)
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		return 0
	}
	// One line, whatever the error wraps.
	fmt.Fprintln(stderr, "publish: "+strings.Join(strings.Fields(err.Error()), " "))
	var ue *usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// options are the parsed flags.
type options struct {
	url, subject, typ, severity, root, id string
	meta                                  []string // K=V as given
	file, jsonl                           string
	json                                  bool
	auth                                  authFlags
	set                                   map[string]bool // flags given on the command line
}

// parseArgs parses flags placed before and after the positional arguments.
func parseArgs(args []string) (*options, []string, error) {
	o := &options{}
	fs := flag.NewFlagSet("publish", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run prints the error or the usage
	fs.Usage = func() {}
	fs.StringVar(&o.url, "url", "", "")
	fs.StringVar(&o.subject, "subject", "", "")
	fs.StringVar(&o.typ, "type", "", "")
	fs.StringVar(&o.severity, "severity", "info", "")
	fs.StringVar(&o.root, "root", "events", "")
	fs.StringVar(&o.id, "id", "", "")
	fs.Func("meta", "", func(s string) error { o.meta = append(o.meta, s); return nil })
	fs.StringVar(&o.file, "file", "", "")
	fs.StringVar(&o.jsonl, "jsonl", "", "")
	fs.BoolVar(&o.json, "json", false, "")
	o.auth.register(fs)

	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, nil, err
			}
			return nil, nil, &usageError{msg: err.Error()}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		// Parse stops at the first positional argument, or after "--":
		// everything after "--" is positional.
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	if o.url == "" {
		o.url = os.Getenv("NATS_URL")
	}
	if o.url == "" {
		o.url = defaultURL
	}
	return o, pos, nil
}

// publish runs the command; a *usageError means exit status 2.
func publish(args []string, stdin io.Reader, stdout io.Writer) error {
	o, pos, err := parseArgs(args)
	if err != nil {
		return err
	}
	if err := checkURL(o.url); err != nil {
		return err
	}
	if err := o.auth.check(); err != nil {
		return err
	}
	if o.jsonl != "" {
		return publishJSONL(o, pos, stdin, stdout)
	}
	ev, err := o.event(pos)
	if err != nil {
		return err
	}
	// Render the message once without a connection: it validates the
	// event (bad usage) and fixes its id and subject.
	msg, err := producer.NewPublisher(nil, o.root).Message(ev)
	if err != nil {
		return &usageError{msg: flagOf(err) + trimBridge(err)}
	}
	ev.ID = msg.Header.Get(producer.HeaderEventID)
	if ev.Payload, err = o.payload(pos, stdin); err != nil {
		return err
	}
	c, err := connect(o)
	if err != nil {
		return err
	}
	defer c.close()
	res, err := c.publish(ev, msg.Subject)
	if err != nil {
		return err
	}
	return printResult(stdout, o.json, res)
}

// event builds the event of the flags, without its payload.
func (o *options) event(pos []string) (producer.Event, error) {
	switch {
	case len(pos) > 1:
		return producer.Event{}, usagef("expected at most one PAYLOAD argument, got %d (quote a payload with spaces)", len(pos))
	case len(pos) == 1 && o.set["file"]:
		return producer.Event{}, usagef("give the payload either as PAYLOAD or with --file, not both")
	case o.set["file"] && o.file == "":
		return producer.Event{}, usagef("--file: empty path (use - for stdin)")
	case o.typ == "" && o.subject == "":
		return producer.Event{}, usagef("give --type or --subject (see publish -h)")
	}
	sev, err := parseSeverity(o.severity)
	if err != nil {
		return producer.Event{}, &usageError{msg: "--severity: " + err.Error()}
	}
	if o.subject != "" && !o.set["severity"] {
		sev = "" // the publisher's default: the subject's severity, else INFO
	}
	if o.subject != "" {
		if err := subjects.ValidateSubject(o.subject); err != nil {
			return producer.Event{}, &usageError{msg: "--subject: " + err.Error()}
		}
	} else {
		if err := subjects.ValidateSubject(o.root); err != nil {
			return producer.Event{}, &usageError{msg: "--root: " + err.Error()}
		}
		if _, err := subjects.Name(o.root, sev, o.typ); err != nil {
			return producer.Event{}, &usageError{msg: "--type: " + err.Error()}
		}
	}
	meta, err := parseMeta(o.meta)
	if err != nil {
		return producer.Event{}, err
	}
	return producer.Event{ID: o.id, Type: o.typ, Severity: sev, Subject: o.subject, Metadata: meta}, nil
}

// payload reads the event data: PAYLOAD, --file, or the default.
func (o *options) payload(pos []string, stdin io.Reader) ([]byte, error) {
	switch {
	case len(pos) == 1:
		return []byte(pos[0]), nil
	case o.file == "-":
		b, err := io.ReadAll(stdin)
		if err != nil {
			return nil, fmt.Errorf("--file -: read stdin: %w", err)
		}
		return b, nil
	case o.file != "":
		b, err := os.ReadFile(o.file)
		if err != nil {
			return nil, fmt.Errorf("--file: %w", err)
		}
		return b, nil
	}
	return []byte(defaultPayload), nil
}

// parseSeverity is subjects.ParseSeverity with a message for people.
func parseSeverity(s string) (subjects.Severity, error) {
	sev, err := subjects.ParseSeverity(s)
	if err != nil {
		return "", fmt.Errorf("%q is not one of info, warning, critical", s)
	}
	return sev, nil
}

// parseMeta turns repeated --meta K=V into a map. Errors name the key,
// never the value.
func parseMeta(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
			return nil, usagef("--meta %q: want KEY=VALUE", k)
		case k == "":
			return nil, usagef("--meta: empty key in KEY=VALUE")
		}
		if _, dup := m[k]; dup {
			return nil, usagef("--meta: key %q given twice", k)
		}
		m[k] = v
	}
	return m, nil
}

// flagOf names the flag behind an error of Publisher.Message that the
// checks in event let through: a control character in the id or the type,
// or a bad metadata key or value.
func flagOf(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "metadata"):
		return "--meta: "
	case strings.Contains(msg, "event id"):
		return "--id: "
	case strings.Contains(msg, "event type"):
		return "--type: "
	}
	return ""
}

// trimBridge drops the "bridge: " prefix of the bridge package's errors:
// publish reports them as its own.
func trimBridge(err error) string {
	return strings.TrimPrefix(err.Error(), "bridge: ")
}

// result is one line of --json output.
type result struct {
	ID        string `json:"id"`
	Subject   string `json:"subject"`
	Stream    string `json:"stream"`
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate"`
}

// printResult prints one event's outcome.
func printResult(w io.Writer, asJSON bool, r producer.PublishResult) error {
	var err error
	if asJSON {
		var b []byte
		b, err = json.Marshal(result{ID: r.ID, Subject: r.Subject, Stream: r.Stream, Seq: r.Seq, Duplicate: r.Duplicate})
		if err == nil {
			_, err = fmt.Fprintf(w, "%s\n", b)
		}
	} else {
		word := "stored"
		if r.Duplicate {
			word = "duplicate"
		}
		_, err = fmt.Fprintf(w, "%s %s id=%s stream=%s seq=%d\n", word, r.Subject, r.ID, r.Stream, r.Seq)
	}
	if err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	return nil
}

// publishCtx is the context of one publish.
func publishCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(context.Background(), publishTimeout,
		fmt.Errorf("no acknowledgement from JetStream within %s", publishTimeout))
}
