package test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
)

// reloadStatus is /status's "config" object (docs/operating.md#health-status-and-metrics).
type reloadStatus struct {
	File       string    `json:"file"`
	Digest     string    `json:"digest"`
	LoadedAt   time.Time `json:"loaded_at"`
	LastReload *struct {
		Time   time.Time `json:"time"`
		Result string    `json:"result"`
		Error  string    `json:"error"`
	} `json:"last_reload"`
}

// configStatus is the bridge's /status "config" object.
func (p *proc) configStatus(t *testing.T) reloadStatus {
	t.Helper()
	resp, err := http.Get("http://" + p.admin + "/status")
	if err != nil {
		t.Fatalf("GET /status: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Config *reloadStatus `json:"config"`
	}
	if err := json.Unmarshal(body, &st); err != nil || st.Config == nil {
		t.Fatalf("/status has no config object (%v): %s", err, body)
	}
	return *st.Config
}

func fileDigest(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// writeConfig replaces the file at path with data by a rename, as editors
// and ConfigMaps do.
func writeConfig(t *testing.T, path, data string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".bridge.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// SIGHUP reloads the file (docs/deploy.md#signals): a destination moved to
// a second receiver is applied; a broken file (an unknown key, a bad
// duration, an unknown destination) and a change that needs a restart are
// refused whole, logged with the file's line or the key, counted and shown
// in /status, and the bridge keeps delivering with the configuration in
// force; SIGHUP never stops it, and SIGTERM still drains and exits 0.
func TestSIGHUPReloads(t *testing.T) {
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	first, second := jetbridgetest.NewReceiver(t), jetbridgetest.NewReceiver(t)
	sc := scenario{natsURL: srv.URL(), sinkURL: first.URL(), maxInFlight: 4, ackWait: 30 * time.Second, shutdownTimeout: 5 * time.Second}
	path := sc.file(t)
	b := runBridge(t, path)
	l := natstest.NewLedger("hup", 8)
	l.PublishOne(t, js, "events.info.hup", 1)
	waitCount(t, first, 1, countTimeout)
	if st := b.configStatus(t); st.Digest != fileDigest(t, path) || st.File != path || st.LastReload != nil {
		t.Fatalf("/status config at start: %+v, want the file's digest and no reload yet", st)
	}

	reloads := func(result string) float64 {
		return b.metric(t, "bridge_config_reloads_total", `result="`+result+`"`)
	}
	hupUntil := func(result string, want float64) {
		t.Helper()
		if err := b.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatalf("SIGHUP: %v", err)
		}
		natstest.Eventually(t, countTimeout, func() error {
			b.failIfExited(t)
			if got := reloads(result); got != want {
				return fmt.Errorf("%s reloads %v, want %v", result, got, want)
			}
			return nil
		})
	}

	// The destination moves to the second receiver: applied.
	moved := sc
	moved.sinkURL = second.URL()
	writeConfig(t, path, moved.yaml())
	hupUntil("applied", 1)
	l.PublishOne(t, js, "events.info.hup", 2)
	waitCount(t, second, 1, countTimeout)
	if st := b.configStatus(t); st.Digest != fileDigest(t, path) || st.LastReload == nil || st.LastReload.Result != "applied" {
		t.Fatalf("/status config after the reload: %+v, want the new digest and applied", st)
	}
	applied := fileDigest(t, path)

	// Broken files: refused, named by line or key; the moved destination
	// keeps delivering.
	broken := []struct{ name, yaml, names string }{
		{"unknown key", strings.Replace(moved.yaml(), "    timeout: 10s\n", "    timeout: 10s\n    tiemout: 2s\n", 1), "bridge.yaml:"},
		{"bad duration", strings.Replace(moved.yaml(), "timeout: 10s", "timeout: ten", 1), "bridge.yaml:"},
		{"unknown destination", moved.yaml() + "  - name: x\n    subjects: [\"events.>\"]\n    destination: nowhere\n", "routes[1].destination"},
	}
	for i, bad := range broken {
		writeConfig(t, path, bad.yaml)
		hupUntil("invalid", float64(i+1))
		st := b.configStatus(t)
		if st.Digest != applied || st.LastReload == nil || st.LastReload.Result != "invalid" || !strings.Contains(st.LastReload.Error, bad.names) {
			t.Fatalf("%s: /status config %+v, want the applied digest and an invalid reload naming %q", bad.name, st, bad.names)
		}
		l.PublishOne(t, js, "events.info.hup", 3+i)
		waitCount(t, second, 2+i, countTimeout)
	}
	if out := b.stdout.String(); !strings.Contains(out, "reload: the configuration file is invalid; the running configuration is unchanged") ||
		!strings.Contains(out, "routes[1].destination") {
		t.Errorf("no log line naming the broken key:\n%s", out)
	}

	// A change that needs a restart, with a live change beside it: refused whole.
	restart := sc // back to the first receiver...
	writeConfig(t, path, restart.yaml()+"stream:\n  max_age: 2h\n")
	hupUntil("needs_restart", 1)
	if st := b.configStatus(t); st.Digest != applied || !strings.Contains(st.LastReload.Error, "stream.max_age") {
		t.Fatalf("/status config after a restart-only change: %+v", st)
	}
	l.PublishOne(t, js, "events.info.hup", 6)
	waitCount(t, second, 5, countTimeout) // ...which the refusal did not apply
	if got := []float64{reloads("applied"), reloads("invalid"), reloads("needs_restart")}; got[0] != 1 || got[1] != 3 || got[2] != 1 {
		t.Errorf("reloads applied/invalid/needs_restart = %v, want [1 3 1]", got)
	}

	b.term(t)
	if code := b.wait(t, 10*time.Second); code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0", code)
	}
	if got := []int{first.Count(), second.Count()}; got[0] != 1 || got[1] != 5 {
		t.Errorf("requests at the first and second receivers %v, want [1 5]", got)
	}
}

// bridge run --watch applies a change of the file once it is left alone,
// written in place or renamed over it, and never a half-written file.
func TestWatchAppliesWritesNeverPartialOnes(t *testing.T) {
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	first, second := jetbridgetest.NewReceiver(t), jetbridgetest.NewReceiver(t)
	sc := scenario{natsURL: srv.URL(), sinkURL: first.URL(), maxInFlight: 4, ackWait: 30 * time.Second, shutdownTimeout: 5 * time.Second}
	path := sc.file(t)
	b := &proc{admin: freeAddr(t)}
	b.child = startBridge(t, bridgeBinary(t), []string{"run", "--config", path, "--watch"},
		"JETBRIDGE_ADMIN_LISTEN="+b.admin, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	b.waitReadyz(t, http.StatusOK, readyTimeout)
	reloads := func(result string) float64 {
		return b.metric(t, "bridge_config_reloads_total", `result="`+result+`"`)
	}
	waitReloads := func(result string, want float64) {
		t.Helper()
		natstest.Eventually(t, countTimeout, func() error {
			b.failIfExited(t)
			if got := reloads(result); got != want {
				return fmt.Errorf("%s reloads %v, want %v", result, got, want)
			}
			return nil
		})
	}
	l := natstest.NewLedger("watch", 4)

	// A half-written file: the first part of the new one, cut inside a
	// key, left alone for longer than the debounce. It is refused.
	moved := sc
	moved.sinkURL = second.URL()
	full := moved.yaml()
	half := full[:strings.Index(full, "destination: sink")+len("destinat")]
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(half); err != nil {
		t.Fatal(err)
	}
	waitReloads("invalid", 1)
	l.PublishOne(t, js, "events.info.watch", 1)
	waitCount(t, first, 1, countTimeout)
	if reloads("applied") != 0 {
		t.Fatal("the half-written file was applied")
	}
	// The writer finishes: applied.
	if _, err := f.WriteString(full[len(half):]); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	waitReloads("applied", 1)
	l.PublishOne(t, js, "events.info.watch", 2)
	waitCount(t, second, 1, countTimeout)

	// Renamed over the file (an editor, a ConfigMap): applied.
	writeConfig(t, path, sc.yaml())
	waitReloads("applied", 2)
	l.PublishOne(t, js, "events.info.watch", 3)
	waitCount(t, first, 2, countTimeout)
	if st := b.configStatus(t); st.Digest != fileDigest(t, path) {
		t.Fatalf("/status digest %s, want the file's %s", st.Digest, fileDigest(t, path))
	}
	if got := []float64{reloads("applied"), reloads("invalid"), reloads("needs_restart")}; got[0] != 2 || got[1] != 1 || got[2] != 0 {
		t.Errorf("reloads applied/invalid/needs_restart = %v, want [2 1 0]", got)
	}
	b.term(t)
	if code := b.wait(t, 10*time.Second); code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0", code)
	}
	if got := []int{first.Count(), second.Count()}; got[0] != 2 || got[1] != 1 {
		t.Errorf("requests at the first and second receivers %v, want [2 1]", got)
	}
}

// bridge run --watch follows a Kubernetes ConfigMap volume's update: the
// file is a link through ..data to a timestamped directory, and the update
// swaps ..data to a new directory by a rename.
func TestWatchFollowsConfigMapSwap(t *testing.T) {
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	first, second := jetbridgetest.NewReceiver(t), jetbridgetest.NewReceiver(t)
	sc := scenario{natsURL: srv.URL(), sinkURL: first.URL(), maxInFlight: 4, ackWait: 30 * time.Second, shutdownTimeout: 5 * time.Second}
	dir := t.TempDir()
	version := func(name, yaml string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "bridge.yaml"), []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(name, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_12_03_v1", sc.yaml())
	path := filepath.Join(dir, "bridge.yaml")
	if err := os.Symlink(filepath.Join("..data", "bridge.yaml"), path); err != nil {
		t.Fatal(err)
	}
	b := &proc{admin: freeAddr(t)}
	b.child = startBridge(t, bridgeBinary(t), []string{"run", "--config", path, "--watch"},
		"JETBRIDGE_ADMIN_LISTEN="+b.admin, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	b.waitReadyz(t, http.StatusOK, readyTimeout)
	l := natstest.NewLedger("cm", 2)
	l.PublishOne(t, js, "events.info.cm", 1)
	waitCount(t, first, 1, countTimeout)

	moved := sc
	moved.sinkURL = second.URL()
	version("..2026_12_03_v2", moved.yaml())
	if err := os.RemoveAll(filepath.Join(dir, "..2026_12_03_v1")); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, countTimeout, func() error {
		b.failIfExited(t)
		if got := b.metric(t, "bridge_config_reloads_total", `result="applied"`); got != 1 {
			return fmt.Errorf("applied reloads %v, want 1", got)
		}
		return nil
	})
	l.PublishOne(t, js, "events.info.cm", 2)
	waitCount(t, second, 1, countTimeout)
	if got := b.metric(t, "bridge_config_reloads_total", `result="invalid"`); got != 0 {
		t.Errorf("invalid reloads %v during the swap, want 0", got)
	}
	b.term(t)
	if code := b.wait(t, 10*time.Second); code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0", code)
	}
}

// A configuration read from a named pipe (as bash's <(...) gives) is read
// once, at start: /status's digest is that of the bytes in force, a
// SIGHUP is refused as needing a restart (opening the pipe again would
// wait for a writer that never comes) and the bridge keeps delivering; and
// --watch refuses a pipe at once (exit 2). The control is TestSIGHUPReloads:
// the same SIGHUP on a regular file applies it.
func TestConfigFromAPipe(t *testing.T) {
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	rcv := jetbridgetest.NewReceiver(t)
	sc := scenario{natsURL: srv.URL(), sinkURL: rcv.URL(), maxInFlight: 4, ackWait: 30 * time.Second, shutdownTimeout: 5 * time.Second}
	data := sc.yaml()
	fifo := filepath.Join(t.TempDir(), "bridge.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	wrote := make(chan error, 1)
	go func() { // opening a FIFO for writing waits for its reader
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err == nil {
			_, err = f.WriteString(data)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		wrote <- err
	}()
	b := runBridge(t, fifo)
	if err := <-wrote; err != nil {
		t.Fatalf("writing the pipe: %v", err)
	}
	sum := sha256.Sum256([]byte(data))
	if st := b.configStatus(t); st.Digest != "sha256:"+hex.EncodeToString(sum[:]) || st.LastReload != nil {
		t.Fatalf("/status config at start: %+v, want the digest of the bytes read from the pipe", st)
	}
	if err := b.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatalf("SIGHUP: %v", err)
	}
	natstest.Eventually(t, countTimeout, func() error {
		b.failIfExited(t)
		if got := b.metric(t, "bridge_config_reloads_total", `result="needs_restart"`); got != 1 {
			return fmt.Errorf("needs_restart reloads %v, want 1", got)
		}
		return nil
	})
	want := "the configuration was not read from a regular file: only a restart reads it again"
	if st := b.configStatus(t); st.LastReload == nil || st.LastReload.Result != "needs_restart" || st.LastReload.Error != want {
		t.Fatalf("/status config after SIGHUP: %+v, want needs_restart: %q", st, want)
	}
	l := natstest.NewLedger("pipe", 8)
	l.PublishOne(t, js, "events.info.pipe", 1)
	waitCount(t, rcv, 1, countTimeout)

	// The pipe has no writer now: --watch refuses it after reading it
	// once, so a writer gives the reader its file again.
	go func() {
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err == nil {
			_, _ = f.WriteString(data)
			_ = f.Close()
		}
	}()
	_, stderr, code := bridgeCmd(t, "run", "--config", fifo, "--watch")
	if wantErr := "bridge: --watch: " + fifo + " is not a regular file (a pipe is read once, at start)\n"; code != 2 || stderr != wantErr {
		t.Fatalf("run --watch on a pipe: exit %d, stderr %q; want exit 2 and %q", code, stderr, wantErr)
	}
}

// With nats.url empty and $NATS_URL set, the server comes from the
// environment, at start and at every reload alike: a SIGHUP that moves the
// destination is applied, not refused for a nats.url the running bridge
// does not have. (Checked against the build before the fix, where every
// such reload was refused as needs_restart.)
func TestSIGHUPWithNATSURLFromTheEnvironment(t *testing.T) {
	srv := jetbridgetest.NewServer(t)
	_, js := srv.Connect(t)
	first, second := jetbridgetest.NewReceiver(t), jetbridgetest.NewReceiver(t)
	sc := scenario{natsURL: `""`, sinkURL: first.URL(), maxInFlight: 4, ackWait: 30 * time.Second, shutdownTimeout: 5 * time.Second}
	path := sc.file(t)
	b := runBridge(t, path, "NATS_URL="+srv.URL())
	l := natstest.NewLedger("env", 8)
	l.PublishOne(t, js, "events.info.env", 1)
	waitCount(t, first, 1, countTimeout)

	moved := sc
	moved.sinkURL = second.URL()
	writeConfig(t, path, moved.yaml())
	if err := b.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatalf("SIGHUP: %v", err)
	}
	natstest.Eventually(t, countTimeout, func() error {
		b.failIfExited(t)
		if st := b.configStatus(t); st.LastReload == nil || st.LastReload.Result != "applied" {
			return fmt.Errorf("last reload %+v, want applied", st.LastReload)
		}
		return nil
	})
	l.PublishOne(t, js, "events.info.env", 2)
	waitCount(t, second, 1, countTimeout)
}
