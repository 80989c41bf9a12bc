// Command bridge runs jetbridge: it delivers events from NATS JetStream to
// HTTP destinations, and offers the commands to check its configuration.
//
// Exit codes: 0 success (bridge run: after SIGINT/SIGTERM and the drain);
// 1 runtime failure (NATS rejected the credentials or the TLS handshake at
// start, the NATS connection was closed for good while running); 2 bad
// usage or invalid configuration, including credential and TLS files that
// are missing, unreadable or do not parse (see the README's Security
// section).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

const usage = `usage: bridge [command] [flags]

commands:
  run      run the bridge until SIGINT/SIGTERM (the default)
  check    validate the configuration and print the routing table
  receive  a local webhook receiver for trying the bridge
  dlq      list, show, replay or purge dead letters ("bridge dlq help")
  demo     a self-contained tour in under 30 s: JetStream, a flaky receiver, the bridge
  version  print version information

Every command takes --config FILE (default $BRIDGE_CONFIG).
Run "bridge COMMAND --help" for the flags of one command.
`

// exitError carries an exit code; its message has already been printed
// when msg is empty.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func usageErr(format string, args ...any) error {
	return &exitError{code: 2, msg: fmt.Sprintf(format, args...)}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a command line and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "run":
		err = cmdRun(args, stdout, stderr)
	case "check":
		err = cmdCheck(args, stdout, stderr)
	case "receive":
		err = cmdReceive(args, stdout, stderr)
	case "dlq":
		err = cmdDLQ(args, stdout, stderr)
	case "demo":
		err = cmdDemo(args, stdout, stderr)
	case "version":
		err = cmdVersion(args, stdout, stderr)
	case "help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "bridge: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintln(stderr, "bridge: "+ee.msg)
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "bridge: "+err.Error())
	return 1
}

// parseFlags parses flags that may come before or after positional
// arguments, and returns the positional ones.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(os.Stdout)
				fmt.Fprintf(os.Stdout, "usage of %s:\n", fs.Name())
				fs.PrintDefaults()
				return nil, err
			}
			return nil, &exitError{code: 2, msg: strings.TrimPrefix(fs.Name(), "bridge ") + ": " + err.Error()}
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// newFlagSet returns a FlagSet that reports a bad flag in one line on
// stderr ("bridge run: flag provided but not defined: -x"); -h prints the
// flags.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("bridge "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// configFlag registers --config with its $BRIDGE_CONFIG default.
func configFlag(fs *flag.FlagSet) *string {
	return fs.String("config", os.Getenv("BRIDGE_CONFIG"), "configuration file (default $BRIDGE_CONFIG)")
}
