package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// readyTimeout bounds how long a child may take to print its ready line.
const readyTimeout = 30 * time.Second

// stopTimeout bounds a child's graceful exit after SIGTERM; then SIGKILL.
const stopTimeout = 10 * time.Second

// child is a process started by the benchmark. Its stderr goes to a log
// file in the run's temp dir (shown when the process fails).
type child struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
	waitErr error         // valid once done is closed
}

// startChild starts path with args and waits for the line it prints on
// stdout when it is ready ("ready ..."); it returns the rest of that line.
// The process is killed when ctx ends or when the benchmark dies
// (Pdeathsig), and stop must be called to reap it.
func startChild(ctx context.Context, logDir, name, path string, args, env []string) (*child, string, error) {
	return startChildWith(ctx, logDir, name, path, args, env, true)
}

// startChildWith is startChild; with waitReady false it returns as soon as
// the process has started (for the bridge, which prints no ready line).
func startChildWith(ctx context.Context, logDir, name, path string, args, env []string, waitReady bool) (*child, string, error) {
	logPath := filepath.Join(logDir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, "", err
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = stopTimeout
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "ready"); ok {
				select {
				case lines <- strings.TrimSpace(line):
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		c.waitErr = cmd.Wait()
		close(c.done)
	}()
	if !waitReady {
		return c, "", nil
	}
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case line := <-lines:
		return c, line, nil
	case <-c.done:
		return nil, "", fmt.Errorf("%s exited before it was ready (%v)%s", name, c.waitErr, c.logTail())
	case <-timer.C:
		c.stop()
		return nil, "", fmt.Errorf("%s not ready within %s%s", name, readyTimeout, c.logTail())
	case <-ctx.Done():
		c.stop()
		return nil, "", context.Cause(ctx)
	}
}

// pid is the child's process id.
func (c *child) pid() int { return c.cmd.Process.Pid }

// exited reports an error if the process has already exited.
func (c *child) exited() error {
	select {
	case <-c.done:
		return fmt.Errorf("%s exited unexpectedly (%v)%s", c.name, c.waitErr, c.logTail())
	default:
		return nil
	}
}

// stop sends SIGTERM, waits up to stopTimeout and then kills the process.
// It returns once the process has been reaped; calling it again is a no-op.
func (c *child) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-c.done:
	case <-timer.C:
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// logTail is the end of the child's stderr, for error messages.
func (c *child) logTail() string {
	b, err := os.ReadFile(c.logPath)
	if err != nil || len(b) == 0 {
		return ""
	}
	const max = 2000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return "; end of its log " + c.logPath + ":\n" + string(b)
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat.
// It is 100 on every Linux architecture Go supports.
const clockTicks = 100

// usage is the CPU time and peak RSS of process pid so far.
func usage(pid int) (time.Duration, int64, error) {
	cpu, err := cpuTime(pid)
	if err != nil {
		return 0, 0, err
	}
	rss, err := peakRSS(pid)
	return cpu, rss, err
}

// cpuTime is the CPU time (user + system) the process has used so far.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may contain spaces:
	// fields are counted after the last ')'. utime and stime are fields 14
	// and 15, i.e. the 12th and 13th after the state (field 3).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// peakRSS is the process's peak resident set size (VmHWM) in bytes.
func peakRSS(pid int) (int64, error) { return statusBytes(pid, "VmHWM") }

// fileRSS is the process's resident file-backed memory (RssFile): mostly
// the pages of its own binary that it has touched.
func fileRSS(pid int) (int64, error) { return statusBytes(pid, "RssFile") }

// statusBytes is a "kB" field of /proc/<pid>/status, in bytes.
func statusBytes(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status %s: %w", pid, field, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

// syscalls is how many read and write system calls (syscr + syscw of
// /proc/<pid>/io) the process has made so far.
func syscalls(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, err
	}
	var total int64
	found := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok || (name != "syscr" && name != "syscw") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/io: %s: %w", pid, name, err)
		}
		total += n
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("/proc/%d/io: no syscr and syscw", pid)
	}
	return total, nil
}

// startPerf records the process pid with Linux perf (call graphs, 999 Hz)
// into out until stopped or until the process exits; name names its log.
// Read the file with `perf report -i out`.
func startPerf(ctx context.Context, logDir, name, out string, pid int) (*child, error) {
	c, _, err := startChildWith(ctx, logDir, name, "perf",
		[]string{"record", "-F", "999", "-g", "-p", strconv.Itoa(pid), "-o", out}, nil, false)
	return c, err
}
