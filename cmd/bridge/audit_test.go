package main

import (
	"os"
	"os/user"
	"regexp"
	"strings"
	"testing"
	"time"
)

// withoutAudit takes the audit line out of r's stderr: at most one, and
// the first line when there is one (it is written when the work is done,
// before the command's closing error).
func withoutAudit(t *testing.T, r result) result {
	t.Helper()
	var rest []string
	n := 0
	for _, l := range strings.SplitAfter(r.stderr, "\n") {
		if strings.HasPrefix(l, "audit: ") {
			n++
			continue
		}
		rest = append(rest, l)
	}
	if n > 1 {
		t.Fatalf("%d audit lines, want at most 1: %s", n, r)
	}
	r.stderr = strings.Join(rest, "")
	return r
}

// auditLine returns the one audit line of r's stderr (without its
// newline), checking its head: the time (RFC 3339 UTC, within the
// test), the operator's user and host names, the command.
func auditLine(t *testing.T, r result, command string, since time.Time) string {
	t.Helper()
	var found []string
	for _, l := range lines(r.stderr) {
		if strings.HasPrefix(l, "audit: ") {
			found = append(found, l)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d audit lines, want 1: %s", len(found), r)
	}
	m := regexp.MustCompile(`^audit: time=(\S+) user=(\S+) host=(\S+) command=("[^"]*"|\S+) `).FindStringSubmatch(found[0])
	if m == nil {
		t.Fatalf("audit line %q: no time, user, host, command", found[0])
	}
	at, err := time.Parse(time.RFC3339, m[1])
	if err != nil || !strings.HasSuffix(m[1], "Z") || at.Before(since.Truncate(time.Second)) || at.After(time.Now()) {
		t.Errorf("audit time %q: want RFC 3339 UTC between %s and now (%v)", m[1], since.UTC().Format(time.RFC3339), err)
	}
	wantUser := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		wantUser = u.Username
	}
	host, _ := os.Hostname()
	if m[2] != auditValue(wantUser) || m[3] != auditValue(host) || m[4] != auditValue(command) {
		t.Errorf("audit line %q: want user %q, host %q, command %q", found[0], wantUser, host, command)
	}
	return strings.TrimPrefix(found[0], m[0])
}

// leaks reports the markers that s holds.
func leaks(s string, markers ...string) []string {
	var out []string
	for _, m := range markers {
		if strings.Contains(s, m) {
			out = append(out, m)
		}
	}
	return out
}

// An audit value can neither break the line nor reach the terminal as a
// control or invisible character, and is bounded; plain values stay bare.
func TestAuditValue(t *testing.T) {
	for in, want := range map[string]string{
		"":                       "-",
		"ra":                     "ra",
		"ev-1:a/b@c+d,e.f":       "ev-1:a/b@c+d,e.f",
		"dlq replay":             `"dlq replay"`,
		"a\nb\rc":                `"a\nb\rc"`,
		"x\x1b[2Jy":              `"x\x1b[2Jy"`,
		"evil\u202eexe":          `"evil\u202eexe"`,
		"é":                      `"\u00e9"`,
		`q"uote`:                 `"q\"uote"`,
		"a=b":                    `"a=b"`,
		strings.Repeat("z", 300): `"` + strings.Repeat("z", 256) + `...(300 bytes)"`,
	} {
		if got := auditValue(in); got != want {
			t.Errorf("auditValue(%q) = %s, want %s", in, got, want)
		}
	}
	a := &audit{}
	many := make([]uint64, 105)
	for i := range many {
		many[i] = uint64(i + 1)
	}
	a.seqs("s", many).seqs("none", nil)
	if got := a.b.String(); !strings.HasSuffix(got, ",99,100,...+5 none=-") || !strings.HasPrefix(got, " s=1,2,3,") {
		t.Errorf("seqs: %q", got)
	}
}
