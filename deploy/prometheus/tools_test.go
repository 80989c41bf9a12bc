package monitoring

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// tool returns the path of an executable from Debian's package prometheus
// (prometheus or promtool). A missing tool skips the test, except in CI
// (CI=true), where it fails it.
func tool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s not found (%v): CI=true requires it; install the Debian package prometheus (apt-get install -y prometheus)", name, err)
	}
	t.Skipf("%s not found: install the Debian package prometheus (apt-get install -y prometheus) to run this test", name)
	return ""
}

// runTool runs a command to its end within a bounded time and returns its
// combined output.
func runTool(t *testing.T, dir string, timeout time.Duration, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (after %s)", ctx.Err(), timeout)
	}
	return string(out), err
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// child is a long-running process the test started; t.Cleanup stops it.
type child struct {
	name string
	cmd  *exec.Cmd
	log  string // its stdout and stderr
	done chan struct{}
	err  error // valid once done is closed
}

// startChild starts a process with its output in a file of dir, and
// registers its stop (SIGTERM, then SIGKILL after 15 s) with t.Cleanup.
func startChild(t *testing.T, name, dir string, env []string, exe string, args ...string) *child {
	t.Helper()
	c := &child{name: name, log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	out, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command(exe, args...)
	c.cmd.Stdout, c.cmd.Stderr = out, out
	c.cmd.Env = env
	if err := c.cmd.Start(); err != nil {
		out.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		c.err = c.cmd.Wait()
		out.Close()
		close(c.done)
	}()
	t.Cleanup(func() { c.stop(t) })
	return c
}

// exited reports whether the process has ended.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stop ends the process: SIGTERM, and SIGKILL if it is still there 15 s
// later. It logs the tail of the process's output when the test failed.
func (c *child) stop(t *testing.T) {
	if !c.exited() {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(15 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}
	if t.Failed() {
		t.Logf("%s (%v), the end of its output:\n%s", c.name, c.err, tail(c.log, 40))
	}
}

// tail is the last n lines of a file.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// waitFor polls cond every 200 ms until it reports true, and fails the
// test after timeout with cond's last explanation. A process of alive
// that exits ends the wait at once.
func waitFor(t *testing.T, what string, timeout time.Duration, alive []*child, cond func() (bool, string)) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		for _, c := range alive {
			if c.exited() {
				t.Fatalf("waiting for %s: %s exited (%v); last: %s", what, c.name, c.err, last)
			}
		}
		select {
		case <-deadline.C:
			t.Fatalf("waiting for %s: no luck after %s; last: %s", what, timeout, last)
		case <-tick.C:
		}
	}
}

// httpGet returns the status and body of a GET, with a short timeout.
func httpGet(url string) (int, []byte, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes(), err
}

// childEnv is this process's environment without the variables that
// would change what the bridge connects to or exports (NATS_URL,
// BRIDGE_CONFIG, OTEL_*), plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "NATS_URL=") || strings.HasPrefix(kv, "BRIDGE_CONFIG=") || strings.HasPrefix(kv, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// bridgeBinaries builds bridge and publish from the repository root once
// per test run and returns their directory.
func bridgeBinaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "jetbridge-monitoring-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildDir = dir
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator), "./cmd/bridge", "./cmd/publish")
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/bridge ./cmd/publish (in the repository root): %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}
