package natstest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// childEnv is the environment variable that tells a re-executed test binary
// which role it plays. It is empty in the parent.
const childEnv = "JETBRIDGE_CHILD"

// childTestTimeout caps a child's lifetime (-test.timeout) in case the
// parent dies without reaping it.
const childTestTimeout = 5 * time.Minute

// ChildRole returns the role this process was started with by StartChild,
// or "" in an ordinary (parent) test process.
func ChildRole() string { return os.Getenv(childEnv) }

// Child is a copy of the test binary running one test as a child process.
type Child struct {
	cmd  *exec.Cmd
	out  Buffer
	done chan struct{} // closed once the process has been reaped
	err  error         // from cmd.Wait; read only after done is closed
}

// StartChild re-executes the test binary (os.Args[0]) running only the
// top-level test testName (-test.run=^testName$ -test.v), with
// JETBRIDGE_CHILD=role plus env ("KEY=value" entries, which win over the
// inherited environment). Stdout and stderr go to one buffer, see Output.
// The child is killed and reaped in t.Cleanup if it is still running, and
// its output is logged if the test failed.
//
// The test named testName must branch on ChildRole(): run the child's part
// when the role is set, the parent's part (or t.Skip) otherwise.
func StartChild(t testing.TB, testName, role string, env ...string) *Child {
	t.Helper()
	if testName == "" || strings.ContainsAny(testName, "=/") {
		t.Fatalf("natstest: StartChild: bad test name %q (want a top-level test name)", testName)
	}
	if role == "" || strings.Contains(role, "=") {
		t.Fatalf("natstest: StartChild: bad role %q (want a plain word; env entries go after it)", role)
	}
	for _, kv := range env {
		if !strings.Contains(kv, "=") {
			t.Fatalf("natstest: StartChild: env entry %q is not KEY=value", kv)
		}
	}
	cmd := exec.Command(os.Args[0],
		"-test.run=^"+regexp.QuoteMeta(testName)+"$",
		"-test.v",
		"-test.count=1",
		"-test.timeout="+childTestTimeout.String(),
	)
	cmd.Env = append(append(os.Environ(), childEnv+"="+role), env...)
	c := &Child{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout = &c.out
	cmd.Stderr = &c.out
	// If the child leaves a grandchild holding the output pipe, do not
	// block Wait forever on copying it.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("natstest: start child %s (%s): %v", testName, role, err)
	}
	go func() {
		defer close(c.done)
		c.err = cmd.Wait()
	}()
	t.Cleanup(func() {
		c.Kill()
		if t.Failed() {
			t.Logf("natstest: output of child %s (%s, pid %d):\n%s", testName, role, c.PID(), c.Output())
		}
	})
	return c
}

// PID is the child's process id.
func (c *Child) PID() int { return c.cmd.Process.Pid }

// Output returns everything the child wrote to stdout and stderr so far.
func (c *Child) Output() string { return c.out.String() }

// Kill sends SIGKILL to the child and waits until it has been reaped. It is
// a no-op if the child has already exited.
func (c *Child) Kill() {
	select {
	case <-c.done:
		return
	default:
	}
	// Kill fails only if the process is already gone; the wait settles it.
	_ = c.cmd.Process.Kill()
	<-c.done
}

// Signal sends sig to the child (e.g. syscall.SIGTERM) without waiting.
func (c *Child) Signal(sig os.Signal) error {
	if err := c.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("natstest: signal child pid %d: %w", c.PID(), err)
	}
	return nil
}

// Wait waits up to timeout for the child to exit and returns its exit code,
// which is -1 if a signal ended it. The error is non-nil if the child is
// still running when timeout passes.
func (c *Child) Wait(timeout time.Duration) (int, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-c.done:
	case <-timer.C:
		return -1, fmt.Errorf("natstest: child pid %d still running after %s", c.PID(), timeout)
	}
	if c.cmd.ProcessState == nil {
		return -1, fmt.Errorf("natstest: child pid %d: %w", c.PID(), c.err)
	}
	return c.cmd.ProcessState.ExitCode(), nil
}

// Buffer is a bytes.Buffer safe for concurrent writes and reads: for the
// output of child processes and for logs that tests read while the code
// under test writes them.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
