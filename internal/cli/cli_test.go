package cli

import (
	"errors"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// testRoot is a small tree: root (--name, -s/--server with the hidden
// alias --url) and "greet WHO" that fails at run time on "nobody".
func testRoot(server *string) *cobra.Command {
	root := NewRoot("prog", "a test program", "")
	root.Args = func(c *cobra.Command, args []string) error {
		if len(args) > 0 {
			return UnknownCommand(c, args[0])
		}
		return nil
	}
	root.RunE = func(*cobra.Command, []string) error { return nil }
	root.Flags().String("name", "", "a name")
	ServerFlag(root.Flags(), server, ServerUsage, "url")
	greet := &cobra.Command{
		Use: "greet WHO",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return Usagef("greet takes one WHO")
			}
			return nil
		},
		RunE: func(_ *cobra.Command, args []string) error {
			if args[0] == "nobody" {
				return errors.New("nobody to greet")
			}
			return nil
		},
	}
	greet.Flags().Bool("loud", false, "shout")
	root.AddCommand(greet)
	return root
}

func TestExecute(t *testing.T) {
	for _, tt := range []struct {
		args   []string
		code   int
		stderr string // contained; "" means empty
	}{
		{[]string{}, 0, ""},
		{[]string{"--help"}, 0, ""},
		{[]string{"greet", "you", "--loud"}, 0, ""},
		{[]string{"greet", "--loud", "you"}, 0, ""},               // flags before or after
		{[]string{"greet", "-loud", "you"}, 0, ""},                // Go-style single dash
		{[]string{"greet", "nobody"}, 1, "prog: nobody to greet"}, // a runtime failure
		{[]string{"greet"}, 2, "prog: greet takes one WHO"},
		{[]string{"gret", "x"}, 2, `unknown command "gret" for "prog"; did you mean "greet"?`},
		{[]string{"greet", "--lud", "x"}, 2, "prog: greet: unknown flag: --lud; did you mean --loud?"},
		{[]string{"greet", "-lod", "x"}, 2, "unknown flag -lod; did you mean --loud?"},
		{[]string{"--nam", "x"}, 2, "prog: unknown flag: --nam; did you mean --name?"},
		{[]string{"--name"}, 2, "flag needs an argument"},
		{[]string{"--url"}, 2, "flag needs an argument"},
	} {
		var server string
		var stdout, stderr strings.Builder
		code := Execute(testRoot(&server), tt.args, &stdout, &stderr)
		if code != tt.code || (tt.stderr == "" && stderr.Len() > 0) || !strings.Contains(stderr.String(), tt.stderr) ||
			strings.Count(stderr.String(), "\n") > 1 {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and one line containing %q", tt.args, code, stderr.String(), tt.code, tt.stderr)
		}
	}
}

// The old spelling of --server sets it, and does not show in the help.
func TestServerFlagAlias(t *testing.T) {
	for _, args := range [][]string{{"--server", "nats://a:1"}, {"-s", "nats://a:1"}, {"--url", "nats://a:1"}, {"--url=nats://a:1"}} {
		var server string
		if code := Execute(testRoot(&server), args, &strings.Builder{}, &strings.Builder{}); code != 0 || server != "nats://a:1" {
			t.Errorf("%q: exit %d, server %q", args, code, server)
		}
	}
	var server string
	var help strings.Builder
	Execute(testRoot(&server), []string{"--help"}, &help, &strings.Builder{})
	if strings.Contains(help.String(), "url") || !strings.Contains(help.String(), "-s, --server") {
		t.Errorf("help:\n%s", help.String())
	}
}

func TestServer(t *testing.T) {
	t.Setenv("NATS_URL", "nats://env:1")
	for _, tt := range []struct{ flag, configured, url, source string }{
		{"nats://flag:1", "nats://cfg:1", "nats://flag:1", "--server"},
		{"", "nats://cfg:1", "nats://cfg:1", "nats.url"},
		{"", "", "nats://env:1", "$NATS_URL"},
	} {
		if url, source := Server(tt.flag, tt.configured, "nats://def:1"); url != tt.url || source != tt.source {
			t.Errorf("Server(%q, %q) = %q, %q; want %q, %q", tt.flag, tt.configured, url, source, tt.url, tt.source)
		}
	}
	t.Setenv("NATS_URL", "")
	if url, source := Server("", "", "nats://def:1"); url != "nats://def:1" || source != "default" {
		t.Errorf("default: %q, %q", url, source)
	}
}

func TestCheckServers(t *testing.T) {
	for raw, ok := range map[string]bool{
		"nats://127.0.0.1:4222":            true,
		"127.0.0.1:4222":                   true,
		"nats://a:1, tls://b:2":            true,
		"http://a:1":                       false,
		"nats://u:p@[::1":                  false,
		"nats://a:1,nats://secret-pw@[::1": false,
	} {
		err := CheckServers(raw)
		if (err == nil) != ok {
			t.Errorf("CheckServers(%q) = %v, want ok=%t", raw, err, ok)
		}
		if err != nil && strings.Contains(err.Error(), "secret-pw") {
			t.Errorf("the error quotes the URL: %v", err)
		}
	}
}

// "help COMMAND" is --help; an unknown topic is bad usage with a
// suggestion.
func TestHelpCommand(t *testing.T) {
	var server string
	var a, b, stderr strings.Builder
	if code := Execute(testRoot(&server), []string{"help", "greet"}, &a, &stderr); code != 0 || !strings.Contains(a.String(), "greet WHO") {
		t.Errorf("help greet: exit %d, %q %q", code, a.String(), stderr.String())
	}
	Execute(testRoot(&server), []string{"greet", "--help"}, &b, &stderr)
	if a.String() != b.String() {
		t.Errorf("help greet differs from greet --help")
	}
	stderr.Reset()
	if code := Execute(testRoot(&server), []string{"help", "gret"}, &a, &stderr); code != 2 || !strings.Contains(stderr.String(), `did you mean "greet"?`) {
		t.Errorf("help gret: exit %d, %q", code, stderr.String())
	}
}
