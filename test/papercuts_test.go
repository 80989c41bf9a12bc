package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
	"github.com/sotercare/jetbridge/producer"
)

// Issue 27's papercuts that need the real binary.

// bridge receive --listen PORT listens on 127.0.0.1:PORT and says so.
func TestReceiveBarePort(t *testing.T) {
	addr := freeAddr(t)
	_, port, _ := strings.Cut(addr, ":")
	c := startBridge(t, bridgeBinary(t), []string{"receive", "--listen", port})
	want := "receiving on http://" + addr + "/ (answering 202, failing 0% with 503); Ctrl-C to stop\n"
	natstest.Eventually(t, readyTimeout, func() error {
		c.failIfExited(t)
		resp, err := http.Post("http://"+addr+"/events", "application/json", strings.NewReader(`{}`))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("status %d, want 202", resp.StatusCode)
		}
		return nil
	})
	if got, _, _ := strings.Cut(c.stdout.String(), "\n"); got+"\n" != want {
		t.Errorf("first line %q, want %q", got, want)
	}
}

// OTEL_TRACES_EXPORTER=console alone, no endpoint anywhere, turns tracing
// on: the start-up line names the console exporter and the delivery's
// span is printed on standard output. Control: without the variable the
// line says none and nothing is printed.
func TestTracingConsoleExporterAlone(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER"} {
		t.Setenv(k, "")
	}
	for _, tt := range []struct {
		exporter, field, msg string
	}{
		{"console", `"exporter":"console"`, `"message":"tracing on: spans printed on standard output, one JSON object each (OTEL_TRACES_EXPORTER=console; docs/tracing.md)"`},
		{"", `"exporter":"none"`, `"message":"tracing off (docs/tracing.md)"`},
	} {
		t.Run("exporter="+tt.exporter, func(t *testing.T) {
			srv := jetbridgetest.NewServer(t)
			rec := jetbridgetest.NewReceiver(t)
			cfg := scenario{natsURL: srv.URL(), sinkURL: rec.URL(), maxInFlight: 1, ackWait: 30 * time.Second, shutdownTimeout: 5 * time.Second}.file(t)
			p := &proc{admin: freeAddr(t)}
			p.child = startBridge(t, bridgeBinary(t), []string{"run", "--config", cfg}, "JETBRIDGE_ADMIN_LISTEN="+p.admin,
				"OTEL_TRACES_EXPORTER="+tt.exporter, "OTEL_BSP_SCHEDULE_DELAY=50", "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
			p.waitReadyz(t, http.StatusOK, readyTimeout)
			srv.Publish(t, producer.Event{ID: "span-1", Type: "order.created", Payload: []byte(`{}`)})
			rec.WaitEvent(t, "span-1")
			natstest.WaitQuiet(t, srv.JetStream(), streamName, routeName, deliveryTimeout)
			if tt.exporter == "console" { // the spans come while the bridge runs (a 50 ms batch delay)
				natstest.Eventually(t, deliveryTimeout, func() error {
					out := p.stdout.String()
					if !strings.Contains(out, `{"Name":"process events.info.order.created",`) || !strings.Contains(out, `{"Name":"POST",`) {
						return fmt.Errorf("no delivery and request spans yet")
					}
					return nil
				})
			}
			p.term(t)
			if code := p.wait(t, 30*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			// The log (JSON lines on stdout) and the spans share stdout.
			out := p.stdout.String()
			var tracingLines []string
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, `"message":"tracing `) {
					tracingLines = append(tracingLines, l)
				}
			}
			if len(tracingLines) != 1 || !strings.Contains(tracingLines[0], tt.field) || !strings.Contains(tracingLines[0], tt.msg) {
				t.Errorf("want one tracing line with %s and %s, got %q", tt.field, tt.msg, tracingLines)
			}
			spans := map[string]string{} // name: trace id
			for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
				var line struct {
					Message     string `json:"message"`
					Name        string
					SpanContext struct{ TraceID string }
				}
				if err := json.Unmarshal([]byte(l), &line); err != nil {
					t.Errorf("stdout line is neither a log line nor a span: %q (%v)", l, err)
					continue
				}
				if line.Message != "" {
					continue // a log line
				}
				spans[line.Name] = line.SpanContext.TraceID
			}
			want := 0
			if tt.exporter == "console" { // the delivery's span and its HTTP request's, one trace
				want = 2
				if tid := spans["process events.info.order.created"]; len(tid) != 32 || spans["POST"] != tid {
					t.Errorf("spans %v: want process events.info.order.created and POST in one trace", spans)
				}
			}
			if len(spans) != want {
				t.Errorf("%d spans on stdout, want %d: %v", len(spans), want, spans)
			}
		})
	}
}

// docCommands returns the commands of our programs in the ```sh block of
// file that contains marker, with the block's comment lines.
func docCommands(t *testing.T, file, marker string) (cmds [][]string, comments string) {
	t.Helper()
	for _, b := range readmeBlocks(t) {
		if b.file != file || b.lang != "sh" || !strings.Contains(b.text, marker) {
			continue
		}
		for _, line := range joinContinued(b.text) {
			if strings.HasPrefix(line, "#") {
				comments += line + "\n"
				continue
			}
			cs, err := commands(line)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				if prog, args, ok := ourProgram(c.argv); ok {
					cmds = append(cmds, append([]string{prog}, args...))
				}
			}
		}
		return cmds, comments
	}
	t.Fatalf("%s has no sh block with %q", file, marker)
	return nil, ""
}

// flagValue is the value of --name in args.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// replaceArg is args with every old replaced by new.
func replaceArg(args []string, old, new string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if a == old {
			out[i] = new
		}
	}
	return out
}

// The dead-letter walkthrough of docs/operating.md, run as written after
// README's "Try it" (their receivers' address moved to a free port, the
// quickstart's NATS, store and admin through its variables): the rejecting
// receiver takes the place of "Try it"'s on the same address once that one
// is stopped, as the walkthrough says, the three events are dead-lettered,
// and dlq list prints the walkthrough's table. Control: started while
// "Try it"'s receiver still runs (what the walkthrough said before), the
// rejecting receiver cannot listen.
func TestDeadLetterWalkthroughAfterTryIt(t *testing.T) {
	bin := readmeBinaries(t)
	root := moduleRoot(t)
	try, _ := docCommands(t, "README.md", "go run ./cmd/bridge receive --listen")
	walk, comments := docCommands(t, "docs/operating.md", "--status 400")
	if len(try) == 0 || try[0][0] != "bridge" || try[0][1] != "receive" || walk[0][0] != "bridge" || walk[0][1] != "receive" {
		t.Fatalf("the blocks do not start with bridge receive: %q, %q", try, walk)
	}
	addr := flagValue(try[0], "--listen")
	if got := flagValue(walk[0], "--listen"); got != addr {
		t.Fatalf("the walkthrough's receiver listens on %s, Try it's (where the bridge delivers) on %s", got, addr)
	}
	if !strings.Contains(comments, `its receiver (terminal 1) stopped with Ctrl-C`) {
		t.Errorf("the walkthrough does not say to stop Try it's receiver first:\n%s", comments)
	}
	recvAddr, natsAddr := freeAddr(t), freeAddr(t)
	env := []string{"JETBRIDGE_NATS_LISTEN=" + natsAddr, "JETBRIDGE_STORE_DIR=" + t.TempDir(), "JETBRIDGE_ADMIN_LISTEN=" + freeAddr(t),
		"JETBRIDGE_RECEIVER_URL=http://" + recvAddr + "/events"}
	pubEnv := append(slices.Clone(env), "NATS_URL=nats://"+natsAddr) // publish's server (the docs' default, 127.0.0.1:4222, moved)
	start := func(args []string) *child {
		return startBridge(t, filepath.Join(bin, args[0]), replaceArg(args[1:], addr, recvAddr), env...)
	}
	listening := func(c *child) {
		natstest.Eventually(t, readyTimeout, func() error {
			c.failIfExited(t)
			if !strings.Contains(c.stdout.String(), "receiving on http://"+recvAddr+"/") {
				return fmt.Errorf("not listening yet: %q", c.stdout.String())
			}
			return nil
		})
	}
	tryRecv := start(try[0])
	listening(tryRecv)
	b := startBridge(t, filepath.Join(bin, "bridge"), []string{"run", "--config", filepath.Join(root, "config", "quickstart.yaml")}, env...)
	b.waitReady(t, "nats://"+natsAddr, "EVENTS")

	// Control: both receivers at once.
	clash := start(walk[0])
	if code := clash.wait(t, readyTimeout); code != 1 || !strings.Contains(clash.stderr.String(), "the address is already in use") {
		t.Fatalf("the rejecting receiver beside Try it's: exit %d, stderr %q; want exit 1, address in use", code, clash.stderr.String())
	}

	// The walkthrough: Ctrl-C in terminal 1, the rejecting receiver in its place.
	if err := tryRecv.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := tryRecv.wait(t, readyTimeout); code != 0 {
		t.Fatalf("Try it's receiver exited %d on Ctrl-C", code)
	}
	listening(start(walk[0]))
	for _, c := range walk[1:] {
		if c[0] != "publish" {
			t.Fatalf("the walkthrough's block runs %q; the test knows receive and publish", c)
		}
		if out, code := runIn(root, pubEnv, filepath.Join(bin, "publish"), c[1:]...); code != 0 {
			t.Fatalf("%q: exit %d\n%s", c, code, out)
		}
	}

	// dlq list prints the table of the walkthrough, times aside.
	var want string
	for _, bl := range readmeBlocks(t) {
		if bl.file == "docs/operating.md" && strings.HasPrefix(bl.text, "$ go run ./cmd/bridge dlq list --config config/quickstart.yaml\n") {
			want, _, _ = strings.Cut(strings.TrimPrefix(bl.text, "$ go run ./cmd/bridge dlq list --config config/quickstart.yaml\n"), "$ ")
		}
	}
	if want == "" {
		t.Fatal("docs/operating.md has no dlq list transcript")
	}
	times := regexp.MustCompile(`[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z`)
	natstest.Eventually(t, deliveryTimeout, func() error {
		out, code := runIn(root, env, filepath.Join(bin, "bridge"), "dlq", "list", "--config", "config/quickstart.yaml")
		if got := times.ReplaceAllString(out, "TIME"); code != 0 || got != times.ReplaceAllString(want, "TIME") {
			return fmt.Errorf("dlq list: exit %d\n%s\nwant\n%s", code, out, want)
		}
		return nil
	})
}
