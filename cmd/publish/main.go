// Command publish publishes jetbridge events to NATS JetStream and prints
// what JetStream stored for each one (docs/testing.md#publishing-events).
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
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sotercare/jetbridge/internal/cli"
	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
)

const long = `Publish one event to NATS JetStream (or many with --jsonl) and print what
JetStream stored. PAYLOAD is the message data, sent as is with Content-Type
application/json; without PAYLOAD or --file it is {}. A payload that is not
JSON is stored with a warning on stderr: routes with format: envelope
dead-letter it. Flags may come before or after PAYLOAD; use -- before a
PAYLOAD that starts with "-".

-H Key:Value adds a NATS header to every event, as nats pub -H does
(repeatable; a key given twice keeps both values). It cannot set the headers
publish sets itself (Nats-Msg-Id, Event-*, Content-Type, traceparent).

The server is, in this order: -s/--server, $NATS_URL, nats://127.0.0.1:4222.

Output, one line per event:
  stored SUBJECT id=ID stream=NAME seq=N
  duplicate SUBJECT id=ID stream=NAME seq=N   (the id is already stored inside the
                                              stream's duplicate window; seq is the original's)
  with --json: {"id":"ID","subject":"SUBJECT","stream":"NAME","seq":N,"duplicate":false}

--jsonl reads one JSON object per line:
  {"id","type","severity","subject","metadata":{},"payload":<json>}
Each line carries its own fields; of the event flags only --root applies
(--subject, --type, --severity, --id and --meta are refused). Blank lines are
skipped. The first bad line stops publish with exit 1; the events before it
stay published.

Exit status: 0 published (duplicates included), 1 runtime failure (no stream
captures the subject, NATS unreachable, a bad --jsonl line), 2 bad usage.`

const example = `  publish --type sensor.fall --severity critical --id fall-42 --meta room=12 '{"resident":"r-7"}'
    prints: stored events.critical.sensor.fall id=fall-42 stream=EVENTS seq=1
  publish --subject events.info.order.created --file examples/order.json --json
  publish --jsonl examples/events.jsonl
  publish -s nats://127.0.0.1:4222 -H X-Tenant:acme --jsonl - < examples/events.jsonl`

// defaultURL is the server when neither --url nor $NATS_URL is set.
const defaultURL = "nats://127.0.0.1:4222"

// defaultPayload is the data of an event given neither PAYLOAD nor --file:
// the smallest JSON document, so envelope destinations accept it.
const defaultPayload = "{}"

// publishTimeout bounds one publish, from the request to JetStream's ack.
const publishTimeout = 10 * time.Second

// usagef is bad usage: exit status 2.
func usagef(format string, args ...any) error { return cli.Usagef(format, args...) }

// usageMsg is bad usage with a message as is.
func usageMsg(msg string) error { return &cli.ExitError{Code: 2, Msg: msg} }

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run runs one command line and returns the exit status. Errors go to
// stderr as one line starting "publish: ".
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return cli.Execute(newCmd(stdin), args, stdout, stderr)
}

// options are the parsed flags.
type options struct {
	url, subject, typ, severity, root, id string
	meta                                  []string // K=V as given
	headers                               []string // -H Key:Value as given
	header                                nats.Header
	file, jsonl                           string
	json                                  bool
	auth                                  authFlags
	set                                   map[string]bool // flags given on the command line
}

func newCmd(stdin io.Reader) *cobra.Command {
	o := &options{}
	c := cli.NewRoot("publish [flags] [PAYLOAD]", "publish events to NATS JetStream", long)
	c.Example = example
	c.Args = cobra.ArbitraryArgs
	c.RunE = func(c *cobra.Command, pos []string) error {
		o.set = map[string]bool{}
		c.Flags().Visit(func(f *pflag.Flag) { o.set[f.Name] = true })
		o.url, _ = cli.Server(o.url, "", defaultURL)
		return publish(o, pos, stdin, c.OutOrStdout(), c.ErrOrStderr())
	}
	f := c.Flags()
	f.SortFlags = false
	cli.ServerFlag(f, &o.url, cli.ServerUsage+" (default $NATS_URL, else "+defaultURL+")", "url")
	f.StringVar(&o.subject, "subject", "", "explicit subject")
	f.StringVar(&o.typ, "type", "", "event type, e.g. order.created; without --subject the subject is <root>.<severity>.<type>")
	f.StringVar(&o.severity, "severity", "info", "info | warning | critical (with --subject: the subject's severity)")
	f.StringVar(&o.root, "root", "events", "subject root")
	f.StringVar(&o.id, "id", "", "event id: sent as Nats-Msg-Id and Event-Id (default: a new unique id)")
	f.StringArrayVar(&o.meta, "meta", nil, "event metadata K=V, repeatable (sent as Event-Meta-K)")
	f.StringArrayVarP(&o.headers, "header", "H", nil, "a NATS header Key:Value, repeatable, as nats pub -H (every event)")
	f.StringVar(&o.file, "file", "", "payload from a file, or - for stdin, instead of PAYLOAD")
	f.StringVar(&o.jsonl, "jsonl", "", "many events from a file (or - for stdin), one JSON object per line")
	f.BoolVar(&o.json, "json", false, "print one JSON result per event")
	o.auth.register(f)
	return c
}

// publish runs the command; an error with exit code 2 is bad usage.
func publish(o *options, pos []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if err := checkURL(o.url); err != nil {
		return err
	}
	if err := o.auth.check(); err != nil {
		return err
	}
	var err error
	if o.header, err = parseHeaders(o.headers); err != nil {
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
		return usageMsg(flagOf(err) + trimBridge(err))
	}
	ev.ID = msg.Header.Get(producer.HeaderEventID)
	if ev.Payload, err = o.payload(pos, stdin); err != nil {
		return err
	}
	if !json.Valid(ev.Payload) {
		fmt.Fprintln(stderr, "publish: warning: the payload is not JSON; it is stored as is, but routes whose destination has format: envelope dead-letter it (reason invalid-event); use format: raw for non-JSON data")
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
		return producer.Event{}, usagef("give --type or --subject (see publish --help)")
	}
	sev, err := parseSeverity(o.severity)
	if err != nil {
		return producer.Event{}, usageMsg("--severity: " + err.Error())
	}
	if o.subject != "" && !o.set["severity"] {
		sev = "" // the publisher's default: the subject's severity, else INFO
	}
	if o.subject != "" {
		if err := subjects.ValidateSubject(o.subject); err != nil {
			return producer.Event{}, usageMsg("--subject: " + err.Error())
		}
	} else {
		if err := subjects.ValidateSubject(o.root); err != nil {
			return producer.Event{}, usageMsg("--root: " + err.Error())
		}
		if _, err := subjects.Name(o.root, sev, o.typ); err != nil {
			return producer.Event{}, usageMsg("--type: " + err.Error())
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
		err = cli.WriteJSON(w, result{ID: r.ID, Subject: r.Subject, Stream: r.Stream, Seq: r.Seq, Duplicate: r.Duplicate})
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
