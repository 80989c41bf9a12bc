// Command bridge runs jetbridge: it delivers events from NATS JetStream to
// HTTP destinations, and offers the commands to check its configuration,
// operate its dead letters and try it out (see docs/operating.md#commands).
//
// Exit codes: 0 success (bridge run: after SIGINT/SIGTERM and the drain);
// 1 runtime failure (NATS rejected the credentials or the TLS handshake at
// start, the NATS connection was closed for good while running); 2 bad
// usage or invalid configuration, including credential and TLS files that
// are missing, unreadable or do not parse (see
// docs/security.md).
//
// This file holds the command tree and the helpers the commands share;
// each command's work is in the file named after it.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	// Mozilla's root certificates, used only where the system has none (the
	// FROM scratch container image): HTTPS destinations and NATS TLS verify
	// there too. A system bundle, where present, always wins.
	_ "golang.org/x/crypto/x509roots/fallback"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/cli"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs a command line and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	return cli.Execute(newRootCmd(), args, stdout, stderr)
}

// exitError and usageErr are the cli package's, by their short names.
type exitError = cli.ExitError

func usageErr(format string, args ...any) error { return cli.Usagef(format, args...) }

const rootLong = `bridge delivers events from NATS JetStream to HTTP endpoints: one durable
pull consumer per route, retries and a circuit breaker per destination, ack
on 2xx, redelivery with backoff, and a dead-letter stream for what cannot be
delivered. With no NATS URL configured it starts an embedded JetStream.

"bridge --config FILE" is "bridge run --config FILE"; so is plain "bridge"
when $BRIDGE_CONFIG is set.`

const rootExample = `  bridge demo                                   # a 15 s tour, nothing to set up
  bridge --config config/quickstart.yaml        # run the bridge
  bridge check --config config/quickstart.yaml  # validate, print the routing table
  bridge dlq list --config config/quickstart.yaml`

// newRootCmd is the command tree of bridge.
func newRootCmd() *cobra.Command {
	var o runOptions
	root := cli.NewRoot("bridge", "deliver events from NATS JetStream to HTTP endpoints", rootLong)
	root.Example = rootExample
	root.Args = func(c *cobra.Command, args []string) error {
		if len(args) > 0 {
			return cli.UnknownCommand(c, args[0])
		}
		return nil
	}
	root.RunE = func(c *cobra.Command, _ []string) error {
		if o.config == "" && os.Getenv("BRIDGE_CONFIG") == "" {
			return c.Help()
		}
		return cmdRun(o, c.OutOrStdout(), c.ErrOrStderr())
	}
	o.register(root.Flags())
	root.AddCommand(newRunCmd(), newCheckCmd(), newReceiveCmd(), newDLQCmd(), newIdemCmd(), newDemoCmd(), newHealthcheckCmd(), newVersionCmd())
	root.AddCommand(newCompletionCmd())
	root.AddCommand(newConsumerCmd())
	return root
}

// configFlag registers --config; an empty value means $BRIDGE_CONFIG
// (configPath).
func configFlag(f *pflag.FlagSet, p *string) {
	f.StringVar(p, "config", "", "configuration file (default $BRIDGE_CONFIG)")
}

// configPath is --config, else $BRIDGE_CONFIG.
func configPath(flag string) string {
	if flag != "" {
		return flag
	}
	return os.Getenv("BRIDGE_CONFIG")
}

// serverFlag registers -s/--server for the commands that connect to NATS.
func serverFlag(f *pflag.FlagSet, p *string) {
	cli.ServerFlag(f, p, cli.ServerUsage+" (default: nats.url, else $NATS_URL, else the embedded server)")
}

// loadConfig loads and validates the file, printing every problem, one per
// line, on stderr; server, when not empty, replaces nats.url (--server).
// Its error carries exit code 2. With neither --server nor nats.url,
// $NATS_URL is used when set (see docs/operating.md#commands); source is then
// "--server" or "$NATS_URL", else "".
func loadConfig(flagPath, server string, stderr io.Writer) (cfg *config.Config, source string, err error) {
	cfg, _, source, err = loadConfigData(flagPath, server, stderr)
	return cfg, source, err
}

// loadConfigData is loadConfig that also returns the file's bytes, read
// once: the configuration is parsed from them.
func loadConfigData(flagPath, server string, stderr io.Writer) (cfg *config.Config, data []byte, source string, err error) {
	path := configPath(flagPath)
	if path == "" {
		return nil, nil, "", usageErr("--config is required (or set $BRIDGE_CONFIG); try --config config/quickstart.yaml")
	}
	data, err = config.ReadFile(path)
	if err == nil {
		cfg, err = config.Load(data, path)
	}
	if err != nil {
		var ve *config.ValidationError
		if errors.As(err, &ve) {
			for _, e := range ve.Unwrap() {
				fmt.Fprintln(stderr, "bridge: "+e.Error())
			}
			return nil, nil, "", &exitError{Code: 2}
		}
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, "", usageErr("--config %s: no such file (the example configurations are in config/, e.g. config/quickstart.yaml)", path)
		}
		return nil, nil, "", &exitError{Code: 2, Msg: err.Error()}
	}
	if source, err = applyServer(cfg, server); err != nil {
		return nil, nil, "", err
	}
	return cfg, data, source, nil
}

// applyServer puts the NATS server a command uses into cfg, in the order
// every command documents (cli.Server): --server, then nats.url, then
// $NATS_URL. source is where it came from when not nats.url ("" then, or
// when none is set: the embedded server). bridge run applies it at start
// and to each reloaded file alike, so that a reload never sees a nats.url
// the running bridge does not have.
func applyServer(cfg *config.Config, server string) (source string, err error) {
	url, from := cli.Server(server, cfg.NATS.URL.Value(), "")
	if from == "nats.url" || url == "" {
		return "", nil
	}
	if err := cli.CheckServers(url); err != nil {
		return "", usageErr("%s: %v", from, err)
	}
	cfg.NATS.URL = config.Secret(url)
	return from, nil
}

// signalContext is cancelled by SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// errText drops the "bridge: " that library errors start with: the
// command prints its own.
func errText(err error) string { return strings.TrimPrefix(err.Error(), "bridge: ") }
