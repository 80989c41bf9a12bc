package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// -H Key:Value sets NATS headers as nats pub -H does: split at the first
// colon, trimmed, repeatable, a repeated key keeps both values in order,
// the name's case kept; on every event of --jsonl too.
func TestPublishHeaderFlag(t *testing.T) {
	s := startStream(t)
	out := mustPublish(t, "", "--server", s.url, "--type", "order.created", "--id", "hdr-1",
		"-H", "X-Tenant:acme", "-H", " x-trace-note : a:b ", "--header", "X-Tenant:beta")
	if out != "stored events.info.order.created id=hdr-1 stream=EVENTS seq=1\n" {
		t.Fatalf("output %q", out)
	}
	m := s.get(t, 1)
	if got := m.Header["X-Tenant"]; !slices.Equal(got, []string{"acme", "beta"}) {
		t.Errorf("X-Tenant = %q, want [acme beta] (all: %v)", got, m.Header)
	}
	if got := m.Header["x-trace-note"]; !slices.Equal(got, []string{"a:b"}) {
		t.Errorf("x-trace-note = %q, want [a:b] (all: %v)", got, m.Header)
	}
	if got := m.Header["Event-Id"]; !slices.Equal(got, []string{"hdr-1"}) {
		t.Errorf("Event-Id = %q", got)
	}
	// Control: without -H the message has no such header.
	mustPublish(t, "", "--server", s.url, "--type", "order.created", "--id", "hdr-2")
	if got, ok := s.get(t, 2).Header["X-Tenant"]; ok {
		t.Errorf("X-Tenant without -H: %q", got)
	}
	mustPublish(t, `{"id":"hdr-3","type":"a.b"}`+"\n"+`{"id":"hdr-4","type":"a.c"}`+"\n", "--server", s.url, "-H", "X-Tenant:acme", "--jsonl", "-")
	for seq := uint64(3); seq <= 4; seq++ {
		if got := s.get(t, seq).Header["X-Tenant"]; !slices.Equal(got, []string{"acme"}) {
			t.Errorf("--jsonl event %d: X-Tenant = %q", seq, got)
		}
	}
}

// A bad -H is bad usage before connecting, named without its value.
func TestPublishHeaderFlagBad(t *testing.T) {
	const secret = "s3cret-Hv7"
	for _, tt := range []struct {
		h, want string
	}{
		{"X-Api-Key=" + secret, "publish: -H: entry 1 has no ':'; want Key:Value, e.g. -H X-Tenant:acme\n"},
		{":" + secret, "publish: -H: entry 1 has an empty name; want Key:Value\n"},
		{"X Key:" + secret, "publish: -H \"X Key\": not a header name (letters, digits and !#$%&'*+-.^_`|~ only)\n"},
		{"X-Api-Key:" + secret + "\r\nX-Evil: 1", "publish: -H X-Api-Key: the value has a control character\n"},
		{"nats-msg-id:" + secret, "publish: -H nats-msg-id: publish sets this header itself (use --id, --type, --severity, --meta, or $TRACEPARENT)\n"},
		{"Traceparent:" + secret, "publish: -H Traceparent: publish sets this header itself (use --id, --type, --severity, --meta, or $TRACEPARENT)\n"},
		{"Event-Meta-Room:" + secret, "publish: -H Event-Meta-Room: an Event-Meta- header is event metadata: use --meta Room=VALUE\n"},
	} {
		o := runPublish(t, "", "--server", "nats://127.0.0.1:1", "--type", "a", "-H", "X-Ok:1", "-H", tt.h)
		want := strings.Replace(tt.want, "entry 1", "entry 2", 1)
		if o.code != 2 || o.stdout != "" || o.stderr != want {
			t.Errorf("-H %q: exit %d, stdout %q, stderr %q; want exit 2 and %q", tt.h, o.code, o.stdout, o.stderr, want)
		}
	}
}

// Every example of publish --help runs as printed, from the repository's
// root, through a shell, and prints what it says; the one server address
// printed (nats://127.0.0.1:4222) is the test server's.
func TestPublishHelpExamplesRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	s := startStream(t)
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "publish"), ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var cmds []string
	sc := bufio.NewScanner(strings.NewReader(example))
	for sc.Scan() {
		if l, ok := strings.CutPrefix(sc.Text(), "  publish "); ok {
			cmds = append(cmds, "publish "+l)
		}
	}
	wants := []*regexp.Regexp{
		regexp.MustCompile(`^stored events\.critical\.sensor\.fall id=fall-42 stream=EVENTS seq=1\n$`),
		regexp.MustCompile(`^\{"id":"[A-Za-z0-9]+","subject":"events\.info\.order\.created","stream":"EVENTS","seq":2,"duplicate":false\}\n$`),
		regexp.MustCompile(`^stored events\.info\.order\.created id=jsonl-1 stream=EVENTS seq=3\nstored events\.info\.order\.paid id=jsonl-2 stream=EVENTS seq=4\nstored events\.critical\.sensor\.fall id=jsonl-3 stream=EVENTS seq=5\nstored events\.warning\.sensor\.moisture id=jsonl-4 stream=EVENTS seq=6\n$`),
		regexp.MustCompile(`^duplicate events\.info\.order\.created id=jsonl-1 stream=EVENTS seq=3\nduplicate events\.info\.order\.paid id=jsonl-2 stream=EVENTS seq=4\nduplicate events\.critical\.sensor\.fall id=jsonl-3 stream=EVENTS seq=5\nduplicate events\.warning\.sensor\.moisture id=jsonl-4 stream=EVENTS seq=6\n$`),
	}
	if len(cmds) != len(wants) {
		t.Fatalf("publish --help has %d examples, the test expects %d:\n%s", len(cmds), len(wants), example)
	}
	for i, line := range cmds {
		line = strings.ReplaceAll(line, "nats://127.0.0.1:4222", s.url)
		cmd := exec.Command("sh", "-c", line)
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "NATS_URL="+s.url)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if err != nil || stderr.String() != "" || !wants[i].MatchString(stdout.String()) {
			t.Errorf("example %d %q: %v\nstdout %q\nstderr %q\nwant stdout matching %s", i+1, line, err, stdout.String(), stderr.String(), wants[i])
		}
	}
	if n := s.msgs(t); n != 6 {
		t.Errorf("%d messages stored, want 6", n)
	}
}
