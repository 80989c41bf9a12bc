package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/cli"
)

// The consumer commands list and delete the durable consumers of the
// source stream (stream.name). A reload that removes a route keeps its
// consumer (docs/configuration.md#what-a-reload-applies); "consumer
// delete" is how an operator removes it for good
// (docs/operating.md#removing-a-route-for-good). Invariants:
//
//   - a consumer that a route of the configuration file names is never
//     deleted (exit 2): that route is in force, or will be at the next
//     start or reload;
//   - nothing is deleted without a confirmation on a terminal or --yes;
//   - only names and counts read from NATS are printed, names escaped;
//   - delete writes one audit line (docs/operating.md#audit-lines) once it
//     has found the source stream, whatever the result (bad usage, a route
//     of the file, an unreachable server or a missing stream write none).

const consumerLong = `List or delete the durable consumers of the source stream (stream.name).
Each route of the configuration has one, named after the route; a route
removed from the file, by a reload or before a restart, leaves its consumer
in place, with what it had not delivered. "consumer list" shows which
consumers a route of the file uses; "consumer delete" removes one that no
route uses any more.

The commands connect as the dlq commands do (--server, nats.url,
$NATS_URL, else the running bridge's embedded server, else the stopped
bridge's store).`

const consumerExample = `  bridge consumer list --config config/sotercare.yaml
  bridge consumer delete --config config/sotercare.yaml family-digest --yes`

func newConsumerCmd() *cobra.Command {
	c := &cobra.Command{Use: "consumer", Short: "list or delete the durable consumers of the source stream", Long: consumerLong, Example: consumerExample}
	cli.Group(c)
	c.AddCommand(newConsumerListCmd(), newConsumerDeleteCmd())
	return c
}

// maxConsumers bounds how many consumers list reads.
const maxConsumers = 10000

// consumerJSON is one consumer of --json.
type consumerJSON struct {
	Name         string `json:"name"`
	Stream       string `json:"stream"`
	InConfig     bool   `json:"in_config"`
	Pending      uint64 `json:"pending"`
	AckPending   int    `json:"ack_pending"`
	LastDelivery string `json:"last_delivery"` // RFC 3339, UTC; "" when nothing was delivered
	Deleted      bool   `json:"deleted,omitempty"`
}

func consumerRecord(cfg *config.Config, ci *jetstream.ConsumerInfo) consumerJSON {
	j := consumerJSON{Name: ci.Name, Stream: ci.Stream, InConfig: routeInConfig(cfg, ci.Name),
		Pending: ci.NumPending, AckPending: ci.NumAckPending}
	if t := ci.Delivered.Last; t != nil {
		j.LastDelivery = t.UTC().Format(time.RFC3339Nano)
	}
	return j
}

func routeInConfig(cfg *config.Config, name string) bool {
	return slices.ContainsFunc(cfg.Routes, func(r *config.Route) bool { return r != nil && r.Name == name })
}

func inConfigText(in bool) string {
	if in {
		return "in config"
	}
	return "not in config"
}

// consumerErr is a JetStream error as the commands print it.
func consumerErr(stream string, err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return &exitError{Code: 1, Msg: "interrupted"}
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return &exitError{Code: 1, Msg: fmt.Sprintf("stream %s does not exist (has the bridge run with this configuration?)", stream)}
	}
	return fmt.Errorf("stream %s: %s", stream, errText(err))
}

// consumerSession opens the dlq commands' connection and binds the
// source stream.
func consumerSession(ctx context.Context, path, server string, stderr io.Writer) (*dlqSession, jetstream.Stream, error) {
	s, err := openDLQ(path, server, stderr)
	if err != nil {
		return nil, nil, err
	}
	st, err := s.js.Stream(ctx, s.cfg.Stream.Name)
	if err != nil {
		s.close()
		return nil, nil, consumerErr(s.cfg.Stream.Name, err)
	}
	return s, st, nil
}

func newConsumerListCmd() *cobra.Command {
	var config, server string
	var asJSON bool
	c := &cobra.Command{
		Use:   "list",
		Short: "the durable consumers of the source stream, and whether a route uses them",
		Long: `List the durable consumers of the source stream (stream.name), by name:
whether a route of the configuration file uses it ("in config") or not
("not in config": a route removed, or a consumer that is not the bridge's),
its pending messages (not yet delivered), its acknowledgements pending
(delivered, not yet settled) and when it last delivered a message ("never"
when it has not). With --json, one object per consumer with the keys name,
stream, in_config, pending, ack_pending, last_delivery (RFC 3339, UTC; ""
when never).`,
		Example: `  bridge consumer list --config config/sotercare.yaml
  bridge consumer list --config config/sotercare.yaml --json`,
		Args: cobra.NoArgs,
	}
	f := c.Flags()
	configFlag(f, &config)
	serverFlag(f, &server)
	f.BoolVar(&asJSON, "json", false, "one JSON object per consumer")
	c.RunE = func(c *cobra.Command, _ []string) error {
		ctx, stop := signalContext()
		defer stop()
		s, st, err := consumerSession(ctx, config, server, c.ErrOrStderr())
		if err != nil {
			return err
		}
		defer s.close()
		var cs []*jetstream.ConsumerInfo
		l := st.ListConsumers(ctx)
		for ci := range l.Info() {
			if ci.Config.Durable == "" {
				continue // ephemeral: no route's
			}
			if len(cs) == maxConsumers {
				return fmt.Errorf("stream %s has more than %d durable consumers: list them with the nats CLI", s.cfg.Stream.Name, maxConsumers)
			}
			cs = append(cs, ci)
		}
		if err := l.Err(); err != nil {
			return consumerErr(s.cfg.Stream.Name, err)
		}
		slices.SortFunc(cs, func(a, b *jetstream.ConsumerInfo) int { return strings.Compare(a.Name, b.Name) })
		stdout := c.OutOrStdout()
		if asJSON {
			for _, ci := range cs {
				j := consumerRecord(s.cfg, ci)
				j.Name, j.Stream = shown(j.Name), shown(j.Stream)
				if err := cli.WriteJSON(stdout, j); err != nil {
					return err
				}
			}
			return nil
		}
		if len(cs) == 0 {
			fmt.Fprintf(stdout, "no durable consumers on stream %s\n", s.cfg.Stream.Name)
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tROUTE\tPENDING\tACK PENDING\tLAST DELIVERY")
		for _, ci := range cs {
			j := consumerRecord(s.cfg, ci)
			last := "never"
			if ci.Delivered.Last != nil {
				last = ci.Delivered.Last.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", shown(j.Name), inConfigText(j.InConfig), j.Pending, j.AckPending, last)
		}
		return tw.Flush()
	}
	return c
}

// validRouteName is the configuration's rule for a route name
// ([A-Za-z0-9_-]+), bounded.
func validRouteName(s string) bool {
	if s == "" || len(s) > 255 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// messages is n messages, in words.
func messages(n uint64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func newConsumerDeleteCmd() *cobra.Command {
	var config, server string
	var asJSON, yes, force bool
	c := &cobra.Command{
		Use:   "delete NAME",
		Short: "delete a durable consumer that no route uses any more (asks first, or --yes)",
		Long: `Delete the durable consumer NAME of the source stream (stream.name): the
consumer of a route removed from the configuration, which a reload keeps.
NAME is a route name ([A-Za-z0-9_-]+). A route of the configuration file
is refused (exit 2): it is in force; remove the route from the file, reload
every replica, then delete. A consumer that does not exist: exit 1. A
consumer that a client still reads (a pull waiting, or messages handed out
and not acknowledged: a bridge not reloaded yet, another replica on the
old file) is refused (exit 1) unless --force is given.

On a terminal it prints the consumer and asks; --yes skips the question,
and is required when stdin is not a terminal (exit 2 without it). It says
how many messages the consumer had pending: they are not lost, they stay
in the stream (with the limits retention the bridge creates; with interest
retention the server removes those no other consumer needs). A route given
this name again later gets a new consumer, which starts from the first
message of the stream that matches its subjects (deliver policy all): what
the old one had delivered is delivered again. One audit line goes to
stderr (who, when, what: stream, consumer, its counts, the result). With
--json: the consumer as "consumer list --json" prints it, with
"deleted": true.`,
		Example: `  bridge consumer delete --config config/sotercare.yaml family-digest
  bridge consumer delete --config config/sotercare.yaml family-digest --yes --json`,
	}
	f := c.Flags()
	configFlag(f, &config)
	serverFlag(f, &server)
	f.BoolVar(&asJSON, "json", false, "the deleted consumer as a JSON object")
	f.BoolVarP(&yes, "yes", "y", false, "do not ask")
	f.BoolVar(&force, "force", false, "delete it even while a client pulls from it or has messages not acknowledged")
	c.RunE = func(c *cobra.Command, args []string) error {
		if len(args) != 1 {
			return usageErr("consumer delete takes exactly one NAME, got %d arguments", len(args))
		}
		name := args[0]
		if !validRouteName(name) {
			if len(name) > 64 {
				name = name[:64] + "..."
			}
			return usageErr("consumer delete: %s is not a route name ([A-Za-z0-9_-]+)", strconv.QuoteToASCII(name))
		}
		if !yes && !stdinIsTerminal(c.InOrStdin()) {
			return usageErr("consumer delete: stdin is not a terminal: give --yes to delete without a question")
		}
		stdout, stderr := c.OutOrStdout(), c.ErrOrStderr()
		ctx, stop := signalContext()
		defer stop()
		s, err := openDLQ(config, server, stderr)
		if err != nil {
			return err
		}
		defer s.close()
		stream := s.cfg.Stream.Name
		if routeInConfig(s.cfg, name) {
			return usageErr("consumer delete: %s is a route of %s: it is in force; remove the route from the file and reload every replica first",
				name, configPath(config))
		}
		st, err := s.js.Stream(ctx, stream)
		if err != nil {
			return consumerErr(stream, err) // no audit line: nothing to work on
		}
		a := newAudit("consumer delete").field("stream", stream).field("consumer", name)
		result := "error"
		defer func() { a.field("result", result).write(stderr) }()
		cons, err := st.Consumer(ctx, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			result = "not-found"
			return &exitError{Code: 1, Msg: fmt.Sprintf("no consumer %s on stream %s (bridge consumer list shows them)", name, stream)}
		}
		if err != nil {
			return consumerErr(stream, err)
		}
		ci := cons.CachedInfo()
		rec := consumerRecord(s.cfg, ci)
		a.field("pending", strconv.FormatUint(rec.Pending, 10)).count("ack_pending", rec.AckPending)
		// A pull waiting or a message handed out means a client (a bridge
		// not reloaded yet, another replica on the old file) still reads
		// it: deleting it would stop that route, and recreating it would
		// deliver the stream again.
		if !force && (ci.NumWaiting > 0 || ci.NumAckPending > 0) {
			result = "in-use"
			return &exitError{Code: 1, Msg: fmt.Sprintf("consumer delete: %s is in use (%s waiting, %s pending): a bridge still pulls from it; reload every replica without the route, or give --force",
				name, messages(uint64(ci.NumWaiting), "pull"), messages(uint64(ci.NumAckPending), "acknowledgement"))}
		}
		if !yes {
			fmt.Fprintf(stderr, "consumer %s of stream %s: %s pending, %s\n", name, stream,
				messages(rec.Pending, "message"), messages(uint64(rec.AckPending), "acknowledgement")+" pending")
			ok, err := confirm(c.InOrStdin(), stderr, fmt.Sprintf("Delete it? Its messages stay in the stream; a route named %s later starts from the stream's first message. [y/N] ", name))
			if err != nil || !ok {
				result = "declined"
				return &exitError{Code: 1, Msg: "consumer delete: not deleted"}
			}
		}
		if err := st.DeleteConsumer(ctx, name); err != nil {
			if errors.Is(err, jetstream.ErrConsumerNotFound) {
				result = "not-found"
				return &exitError{Code: 1, Msg: fmt.Sprintf("no consumer %s on stream %s (deleted meanwhile)", name, stream)}
			}
			return consumerErr(stream, err)
		}
		result = "deleted"
		if asJSON {
			rec.Deleted = true
			return cli.WriteJSON(stdout, rec)
		}
		fmt.Fprintf(stdout, "deleted consumer %s of stream %s: it had %s pending and %s pending\n", name, stream,
			messages(rec.Pending, "message"), messages(uint64(rec.AckPending), "acknowledgement"))
		if st.CachedInfo().Config.Retention == jetstream.InterestPolicy {
			fmt.Fprintln(stdout, "the stream's retention is interest: the server removes the messages that no other consumer still needs")
		} else {
			fmt.Fprintln(stdout, "its messages stay in the stream; a route named "+name+" created again starts from the stream's first message matching its subjects, delivered ones included")
		}
		return nil
	}
	return c
}
