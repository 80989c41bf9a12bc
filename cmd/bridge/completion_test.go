package main

import (
	"strings"
	"testing"
)

// bridge completion prints each shell's script, and the scripts call back
// into the binary ("bridge __complete"), which lists the commands.
func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{
		"bash": "# bash completion V2 for bridge",
		"zsh":  "#compdef bridge",
		"fish": "# fish completion for bridge",
	} {
		r := runBridge(t, "completion", shell)
		if r.code != 0 || r.stderr != "" || !strings.HasPrefix(r.stdout, want) || !strings.Contains(r.stdout, "__complete") {
			t.Errorf("completion %s: want exit 0 and a script starting %q, got exit %d, stderr %q, %d bytes starting %q",
				shell, want, r.code, r.stderr, len(r.stdout), firstLine(r.stdout))
		}
	}
	r := runBridge(t, "__complete", "dl")
	if r.code != 0 || r.stdout != "dlq\tlist, show, replay or purge dead letters\n:4\n" {
		t.Errorf("__complete dl: %s", r)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"completion"}, "bridge: completion needs one shell: bash, zsh or fish (e.g. bridge completion bash)\n"},
		{[]string{"completion", "powershell"}, "bridge: completion: unknown shell \"powershell\": want bash, zsh or fish\n"},
	} {
		if r := runBridge(t, tt.args...); r.code != 2 || r.stdout != "" || r.stderr != tt.want {
			t.Errorf("bridge %q: want exit 2 and %q, got %s", tt.args, tt.want, r)
		}
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
