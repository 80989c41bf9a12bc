// Package cli is what the three commands (bridge, publish, sotercare)
// share about their command line, so that they look and behave alike: the
// cobra setup (help with descriptions, arguments, defaults and examples,
// suggestions for a mistyped command or flag), exit codes, the NATS server
// flag and its precedence, terminal detection and JSON output.
//
// Invariants (see docs/operating.md#commands): exit 0 on success or
// help, 1 on a runtime failure, 2 on bad usage or an invalid
// configuration; an error is one line on stderr, prefixed with the
// command's name; flags may come before or after positional arguments.
package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/sotercare/jetbridge/internal/buildinfo"
)

// ExitError is an error with an exit code. An empty Msg means that the
// problem has already been printed.
type ExitError struct {
	Code int
	Msg  string
}

func (e *ExitError) Error() string { return e.Msg }

// Usagef is bad usage: exit code 2.
func Usagef(format string, args ...any) error {
	return &ExitError{Code: 2, Msg: fmt.Sprintf(format, args...)}
}

// NewRoot returns the root command of a program: errors and usage are
// printed by Execute (one line), the shell-completion command is left out,
// "help" and --help work on every command, and --version prints
// "jetbridge VERSION (revision R, TIME)" as Go recorded them
// (internal/buildinfo).
func NewRoot(use, short, long string) *cobra.Command {
	root := &cobra.Command{
		Use:                        use,
		Short:                      short,
		Long:                       long,
		Version:                    buildinfo.Read().String(),
		SilenceErrors:              true,
		SilenceUsage:               true,
		SuggestionsMinimumDistance: 2,
		CompletionOptions:          cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetFlagErrorFunc(flagError)
	root.SetVersionTemplate("jetbridge {{.Version}}\n")
	root.SetHelpCommand(&cobra.Command{
		Use:   "help [command]",
		Short: "show the help of any command",
		Long:  "Show the help of any command, e.g. \"" + strings.Fields(use)[0] + " help COMMAND\".",
		RunE: func(c *cobra.Command, args []string) error {
			cmd, rest, err := c.Root().Find(args)
			if err != nil || cmd == nil || len(rest) > 0 {
				parent := c.Root()
				if cmd != nil {
					parent = cmd
				}
				return UnknownCommand(parent, args[len(args)-1])
			}
			cmd.InitDefaultHelpFlag()
			cmd.InitDefaultVersionFlag()
			return cmd.Help()
		},
	})
	return root
}

// Group makes cmd a command that only holds subcommands: without one, or
// with an unknown one, it is bad usage naming the valid ones. Its flags are
// not parsed (they belong to the subcommands), except -h/--help.
func Group(cmd *cobra.Command) {
	cmd.DisableFlagParsing = true
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(c *cobra.Command, args []string) error {
		for _, a := range args {
			switch {
			case a == "-h" || a == "--help" || a == "help":
				return c.Help()
			case !strings.HasPrefix(a, "-"):
				return UnknownCommand(c, a)
			}
		}
		return Usagef("%s needs a command: %s (run %q)", c.Name(), strings.Join(subcommands(c), ", "), c.CommandPath()+" --help")
	}
}

// UnknownCommand is the error for a command line naming no command of c,
// with the nearest valid one when there is one.
func UnknownCommand(c *cobra.Command, name string) error {
	msg := fmt.Sprintf("unknown command %q for %q", name, c.CommandPath())
	if c.SuggestionsMinimumDistance <= 0 {
		c.SuggestionsMinimumDistance = 2
	}
	if s := c.SuggestionsFor(name); len(s) > 0 {
		msg += fmt.Sprintf("; did you mean %q?", s[0])
	}
	return Usagef("%s (run %q for the commands)", msg, c.CommandPath()+" --help")
}

func subcommands(c *cobra.Command) []string {
	var out []string
	for _, s := range c.Commands() {
		if s.IsAvailableCommand() {
			out = append(out, s.Name())
		}
	}
	return out
}

// NoArgs refuses positional arguments.
func NoArgs(c *cobra.Command, args []string) error {
	if len(args) > 0 {
		return Usagef("%s takes no arguments, got %q", c.Name(), args[0])
	}
	return nil
}

// flagError makes a flag parsing error one line that names the flag and,
// for an unknown one, the nearest valid flag.
func flagError(c *cobra.Command, err error) error {
	msg := err.Error()
	var name string
	switch {
	case strings.HasPrefix(msg, "unknown flag: --"):
		name = strings.TrimPrefix(msg, "unknown flag: --")
	case strings.HasPrefix(msg, "unknown shorthand flag: "):
		// "-config" is read as -c -o -n...: Go-style single-dash long
		// flags are the usual cause.
		if _, word, ok := strings.Cut(msg, " in -"); ok {
			name = word
			if i := strings.IndexByte(name, '='); i >= 0 {
				name = name[:i]
			}
			msg = fmt.Sprintf("unknown flag -%s", name)
			if c.Flags().Lookup(name) != nil {
				return Usagef("%s%s; long flags take two dashes: --%s", where(c), msg, name)
			}
		}
	}
	if name != "" {
		if i := strings.IndexByte(name, '='); i >= 0 {
			name = name[:i]
		}
		if s := nearestFlag(c.Flags(), name); s != "" {
			msg += fmt.Sprintf("; did you mean --%s?", s)
		}
		msg += fmt.Sprintf(" (run %q for the flags)", c.CommandPath()+" --help")
	}
	return Usagef("%s%s", where(c), msg)
}

// where is "COMMAND: " for a subcommand's messages (Execute prefixes the
// program's name), "" for the root's.
func where(c *cobra.Command) string {
	if !c.HasParent() {
		return ""
	}
	return strings.TrimPrefix(c.CommandPath(), c.Root().Name()+" ") + ": "
}

// singleDash rewrites a Go-style single-dash long flag ("-config") of the
// command that args select into its two-dash form: pflag would read it as
// a cluster of one-letter flags ("-c onfig").
func singleDash(root *cobra.Command, args []string) []string {
	c, _, err := root.Find(args)
	if err != nil {
		c = root
	}
	out := slices.Clone(args)
	for i, a := range out {
		if a == "--" {
			break
		}
		if len(a) < 3 || a[0] != '-' || a[1] == '-' {
			continue
		}
		name, _, _ := strings.Cut(a[1:], "=")
		if len(name) > 1 && c.Flags().Lookup(name) != nil {
			out[i] = "-" + a
		}
	}
	return out
}

// nearestFlag is the visible flag name closest to name (edit distance at
// most 2, or name as a prefix), or "".
func nearestFlag(fs *pflag.FlagSet, name string) string {
	best, bestD := "", 3
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := distance(strings.ToLower(name), f.Name)
		if strings.HasPrefix(f.Name, name) && len(name) >= 2 {
			d = min(d, 1)
		}
		if d < bestD {
			best, bestD = f.Name, d
		}
	})
	return best
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// Execute runs root on args and returns the exit code. Errors are printed
// on stderr as one line "NAME: message": 2 for bad usage (parsing, a
// command's checks before it starts working, *ExitError with code 2), the
// code of an *ExitError, else 1.
func Execute(root *cobra.Command, args []string, stdout, stderr io.Writer) int {
	started := false
	prev := root.PersistentPreRunE
	root.PersistentPreRunE = func(c *cobra.Command, a []string) error {
		started = true
		if prev != nil {
			return prev(c, a)
		}
		return nil
	}
	root.SetArgs(singleDash(root, args))
	root.SetOut(stdout)
	root.SetErr(stderr)
	_, err := root.ExecuteC()
	if err == nil || errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	code := 1
	if !started {
		code = 2
	}
	msg := err.Error()
	var ee *ExitError
	if errors.As(err, &ee) {
		code, msg = ee.Code, ee.Msg
	}
	if msg != "" {
		fmt.Fprintln(stderr, root.Name()+": "+strings.Join(strings.Fields(msg), " "))
	}
	return code
}

// ServerUsage is the help text of -s/--server.
const ServerUsage = "NATS server URL(s), comma-separated"

// ServerFlag registers -s/--server on fs; each alias (an older spelling,
// e.g. "url") is accepted as the same flag and not shown in the help.
func ServerFlag(fs *pflag.FlagSet, p *string, usage string, aliases ...string) {
	fs.StringVarP(p, "server", "s", "", usage)
	if len(aliases) == 0 {
		return
	}
	prev := fs.GetNormalizeFunc()
	fs.SetNormalizeFunc(func(f *pflag.FlagSet, name string) pflag.NormalizedName {
		if slices.Contains(aliases, name) {
			return "server"
		}
		return prev(f, name)
	})
}

// Server is the NATS server a command uses, and where it came from, in
// the order every command documents: --server, then the command's own
// setting (a configuration file's nats.url; "" when there is none), then
// $NATS_URL, then def.
func Server(flag, configured, def string) (url, source string) {
	switch {
	case flag != "":
		return flag, "--server"
	case configured != "":
		return configured, "nats.url"
	case os.Getenv("NATS_URL") != "":
		return os.Getenv("NATS_URL"), "$NATS_URL"
	}
	return def, "default"
}

// ParseServers parses a comma-separated server list as nats.Connect reads
// it (a missing scheme means nats://). Unparseable entries are nil.
func ParseServers(raw string) []*url.URL {
	var out []*url.URL
	for s := range strings.SplitSeq(raw, ",") {
		s = strings.TrimSpace(s)
		if !strings.Contains(s, "://") {
			s = "nats://" + s
		}
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			u = nil
		}
		out = append(out, u)
	}
	return out
}

// ConnectCause is the text of an error of nats.Connect. nats.go reports a
// refused connection as "no servers available", so then the dial error of
// the first server is added ("connect: connection refused", a DNS
// failure...). Callers scrub it of the credentials they know.
func ConnectCause(err error, servers string) string {
	if !errors.Is(err, nats.ErrNoServers) {
		return err.Error()
	}
	first, _, _ := strings.Cut(servers, ",")
	urls := ParseServers(first)
	if len(urls) == 0 || urls[0] == nil {
		return err.Error()
	}
	u := urls[0]
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "4222")
	}
	c, derr := net.DialTimeout("tcp", host, 2*time.Second)
	if derr != nil {
		return err.Error() + " (" + derr.Error() + ")"
	}
	c.Close()
	return err.Error()
}

// CheckServers validates a server list without echoing it: it may hold
// credentials.
func CheckServers(raw string) error {
	for i, u := range ParseServers(raw) {
		if u == nil {
			return fmt.Errorf("server %d of the list is not a valid URL", i+1)
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return fmt.Errorf("server %d of the list: scheme %q, want nats, tls, ws or wss", i+1, u.Scheme)
		}
	}
	return nil
}

// IsTerminal reports whether w is a terminal (an *os.File that
// golang.org/x/term says is one).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// WriteJSON writes v as one line of JSON (HTML characters not escaped).
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}
