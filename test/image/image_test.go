package image

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/jetbridgetest"
	"github.com/sotercare/jetbridge/producer"
)

// The container image, as far as this machine allows: podman builds it
// but cannot run a container (the sandbox refuses setrlimit), so the test
// checks the image's metadata with podman image inspect, its filesystem
// with podman create + podman export, and runs the image's own entrypoint
// from the exported filesystem with chroot, as the image's user, against
// a real JetStream server and a real HTTP receiver.
func TestImage(t *testing.T) {
	for _, tool := range []string{"podman", "chroot", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			unavailable(t, "%s is not installed: apt-get install -y podman (Debian package podman; chroot and tar are in coreutils and tar)", tool)
		}
	}
	if os.Geteuid() != 0 {
		unavailable(t, "chroot --userspec needs root")
	}
	requireClone(t)
	dist, _ := sharedRelease(t)
	osArch := strings.ReplaceAll(platform, "/", "_")
	version := buildVersion(t, filepath.Join(dist, osArch, "bridge"))
	revision := git(t, "rev-parse", "HEAD")

	// The build context: the files of the repository the Containerfile and
	// .dockerignore name, with the release build as dist/, so that a
	// user's own dist/ is never touched.
	ctxDir := t.TempDir()
	for _, f := range []string{"Containerfile", ".dockerignore", "LICENSE", "deploy/container/bridge.yaml"} {
		copyFile(t, filepath.Join(root, f), filepath.Join(ctxDir, f))
	}
	for _, f := range []string{"bridge", "publish", "sotercare", "THIRD_PARTY_LICENSES"} {
		copyFile(t, filepath.Join(dist, osArch, f), filepath.Join(ctxDir, "dist", osArch, f))
	}

	tag := "localhost/jetbridge-image-test:" + randomID(t)
	podman(t, "build", "--format", "docker", "--layers=false", "--quiet",
		"--build-arg", "VERSION="+version, "--build-arg", "REVISION="+revision, "-t", tag, ctxDir)
	t.Cleanup(func() { podmanQuiet("rmi", "--force", tag) })

	// The metadata.
	var inspected []struct {
		Architecture, Os string
		Config           struct {
			User         string
			Entrypoint   []string
			Cmd          []string
			Env          []string
			Labels       map[string]string
			ExposedPorts map[string]struct{}
		}
		Healthcheck *struct{ Test []string }
	}
	if err := json.Unmarshal([]byte(podman(t, "image", "inspect", tag)), &inspected); err != nil || len(inspected) != 1 {
		t.Fatalf("podman image inspect: %d images, %v", len(inspected), err)
	}
	img := inspected[0]
	cfg := img.Config
	if img.Os != "linux" || img.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", img.Os, img.Architecture, runtime.GOARCH)
	}
	if cfg.User != "65532:65532" {
		t.Errorf("User %q, want 65532:65532", cfg.User)
	}
	if want := []string{"/usr/local/bin/bridge"}; !slices.Equal(cfg.Entrypoint, want) {
		t.Errorf("Entrypoint %q, want %q", cfg.Entrypoint, want)
	}
	if want := []string{"run"}; !slices.Equal(cfg.Cmd, want) {
		t.Errorf("Cmd %q, want %q", cfg.Cmd, want)
	}
	labels := maps.Clone(cfg.Labels)
	delete(labels, "io.buildah.version") // podman's own, added to every image it builds
	wantLabels := map[string]string{
		"org.opencontainers.image.title":       "jetbridge",
		"org.opencontainers.image.description": "Carries events from NATS JetStream to HTTP endpoints",
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.revision":    revision,
		"org.opencontainers.image.source":      "https://github.com/sotercare/jetbridge",
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	if !maps.Equal(labels, wantLabels) {
		t.Errorf("Labels %q,\nwant %q", labels, wantLabels)
	}
	if ports := slices.Sorted(maps.Keys(cfg.ExposedPorts)); !slices.Equal(ports, []string{"8088/tcp"}) {
		t.Errorf("ExposedPorts %q, want [8088/tcp]", ports)
	}
	wantHealth := []string{"CMD", "/usr/local/bin/bridge", "healthcheck"}
	if img.Healthcheck == nil || !slices.Equal(img.Healthcheck.Test, wantHealth) {
		t.Errorf("Healthcheck %+v, want test %q (exec form, no shell)", img.Healthcheck, wantHealth)
	}
	var env []string // the image's environment but PATH, which has nothing to find
	for _, kv := range cfg.Env {
		if !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	if want := []string{"BRIDGE_CONFIG=/etc/jetbridge/bridge.yaml"}; !slices.Equal(env, want) {
		t.Errorf("Env %q: want PATH and %q", cfg.Env, want)
	}
	if t.Failed() {
		t.FailNow()
	}

	// The filesystem: exactly these entries, no shell.
	cid := strings.TrimSpace(podman(t, "create", tag))
	t.Cleanup(func() { podmanQuiet("rm", "--force", cid) })
	exported := filepath.Join(t.TempDir(), "rootfs.tar")
	podman(t, "export", "-o", exported, cid)
	rootfs := t.TempDir()
	if out, err := exec.Command("tar", "-x", "-f", exported, "-C", rootfs).CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v\n%s", err, out)
	}
	// t.TempDir is 0700: the image's user must be able to enter its "/".
	if err := os.Chmod(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	got := exportedEntries(t, exported)
	want := map[string]string{
		"etc/": "dir", "etc/jetbridge/": "dir", "etc/jetbridge/bridge.yaml": "file",
		"usr/": "dir", "usr/local/": "dir", "usr/local/bin/": "dir", "usr/local/bin/bridge": "exec",
		"usr/share/": "dir", "usr/share/doc/": "dir", "usr/share/doc/jetbridge/": "dir",
		"usr/share/doc/jetbridge/LICENSE": "file", "usr/share/doc/jetbridge/THIRD_PARTY_LICENSES": "file",
	}
	if !maps.Equal(got, want) {
		t.Errorf("the image's files:\n%v\nwant:\n%v", got, want)
	}
	for _, sh := range []string{"bin/sh", "usr/bin/sh", "bin/busybox"} {
		if _, err := os.Lstat(filepath.Join(rootfs, sh)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("/%s in the image: want no shell (%v)", sh, err)
		}
	}
	for image, repo := range map[string]string{
		"usr/local/bin/bridge":                         filepath.Join(dist, osArch, "bridge"),
		"etc/jetbridge/bridge.yaml":                    filepath.Join(root, "deploy/container/bridge.yaml"),
		"usr/share/doc/jetbridge/LICENSE":              filepath.Join(root, "LICENSE"),
		"usr/share/doc/jetbridge/THIRD_PARTY_LICENSES": filepath.Join(dist, osArch, "THIRD_PARTY_LICENSES"),
	} {
		if !sameContent(t, filepath.Join(rootfs, image), repo) {
			t.Errorf("/%s differs from %s", image, repo)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// The admin listener of the image's configuration is 0.0.0.0:8088. On
	// a shared machine another process may hold that port; only then the
	// test writes its own copy of the configuration, the same but for the
	// port, over the exported /etc/jetbridge/bridge.yaml (the image's
	// file cannot be overridden otherwise without changing the command).
	adminPort := "8088"
	if l, err := net.Listen("tcp", "0.0.0.0:8088"); err != nil {
		adminPort = ownAdminPort(t, rootfs, err)
	} else {
		l.Close()
	}

	// The image's entrypoint and command, as the image's user, against a
	// real JetStream server and a real receiver on loopback (the chroot
	// has no /etc/hosts or resolv.conf: addresses only).
	srv := jetbridgetest.NewServer(t)
	rcv := jetbridgetest.NewReceiver(t)
	runEnv := append(slices.Clone(cfg.Env), "NATS_URL="+srv.URL(), "DESTINATION_URL="+rcv.URL()+"/events")
	argv := append([]string{"--userspec=" + cfg.User, rootfs}, cfg.Entrypoint...)
	argv = append(argv, cfg.Cmd...)
	var (
		bridge *exec.Cmd
		logs   *natstest.Buffer
		exited chan error
	)
	for try := 1; ; try++ {
		bridge, logs, exited = startChroot(t, argv, runEnv)
		// Ready: connected, stream created, consumer bound.
		err := natstest.Poll(60*time.Second, func() error {
			select {
			case err := <-exited:
				exited <- err
				return fmt.Errorf("the bridge exited: %v", err)
			default:
			}
			return getStatus("http://127.0.0.1:"+adminPort+"/readyz", http.StatusOK)
		})
		if err == nil {
			break
		}
		if try == 1 && adminPort == "8088" && strings.Contains(logs.String(), "address already in use") {
			// Another process took 8088 between the check above and the
			// bridge's start.
			adminPort = ownAdminPort(t, rootfs, errors.New("taken while the bridge started"))
			continue
		}
		t.Fatalf("bridge not ready: %v\nits output:\n%s", err, logs.String())
	}

	id := "image-test-" + randomID(t)
	srv.Publish(t, producer.Event{ID: id, Subject: "events.test", Payload: []byte(`{"from":"image test"}`)})
	got1 := rcv.WaitEvent(t, id)
	if got1.Method != http.MethodPost || got1.Path != "/events" {
		t.Errorf("delivery: %s %s, want POST /events", got1.Method, got1.Path)
	}
	// Exactly once: the route's consumer has acknowledged its one
	// delivery, so JetStream will not deliver it again.
	err := natstest.Poll(30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := srv.JetStream().Consumer(ctx, "EVENTS", "events")
		if err != nil {
			return err
		}
		i := c.CachedInfo()
		if i.NumPending != 0 || i.NumAckPending != 0 || i.AckFloor.Consumer != 1 {
			return fmt.Errorf("consumer EVENTS/events: %d pending, %d awaiting ack, ack floor %d", i.NumPending, i.NumAckPending, i.AckFloor.Consumer)
		}
		if i.Delivered.Consumer != 1 || i.NumRedelivered != 0 {
			return fmt.Errorf("consumer EVENTS/events: %d deliveries, %d redelivered: want exactly 1, 0", i.Delivered.Consumer, i.NumRedelivered)
		}
		return nil
	})
	if err != nil {
		t.Errorf("%v\nbridge output:\n%s", err, logs.String())
	}
	if n := len(rcv.Events(id)); n != 1 || rcv.Count() != 1 {
		t.Errorf("the receiver got event %s %d times and %d requests in all, want exactly 1", id, n, rcv.Count())
	}

	// The image's health check, run as the image runs it: exec form, the
	// image's user and environment.
	hc := exec.Command("chroot", append([]string{"--userspec=" + cfg.User, rootfs}, img.Healthcheck.Test[1:]...)...)
	hc.Env = runEnv
	if out, err := hc.CombinedOutput(); err != nil {
		t.Errorf("bridge healthcheck: %v\n%s", err, out)
	}

	// SIGTERM: drain and exit 0.
	if err := bridge.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Errorf("after SIGTERM the bridge exited with %v, want 0\nits output:\n%s", err, logs.String())
		}
	case <-time.After(60 * time.Second):
		t.Errorf("the bridge still runs 60s after SIGTERM\nits output:\n%s", logs.String())
	}
	// Its log is JSON, one object a line (log.format json).
	for l := range strings.Lines(logs.String()) {
		if !json.Valid([]byte(l)) {
			t.Errorf("a log line that is not JSON: %q", l)
		}
	}
}

// ownAdminPort writes the test's own copy of the image's configuration
// over the exported /etc/jetbridge/bridge.yaml, the same but for the admin
// port: a free one, since 8088 is taken on this machine (the image's file
// cannot be overridden otherwise without changing the image's command).
func ownAdminPort(t *testing.T, rootfs string, why error) string {
	t.Helper()
	port := freePort(t)
	t.Logf("0.0.0.0:8088 is taken (%v): the bridge listens on %s instead", why, port)
	conf := filepath.Join(rootfs, "etc/jetbridge/bridge.yaml")
	data, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(string(data), `listen: "0.0.0.0:8088"`, `listen: "0.0.0.0:`+port+`"`, 1)
	if changed == string(data) {
		t.Fatal(`the image's bridge.yaml has no listen: "0.0.0.0:8088" to change`)
	}
	if err := os.WriteFile(conf, []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	return port
}

// startChroot starts chroot with argv and env; the process is killed at
// cleanup if it still runs. chroot execs its command, so the process is
// the bridge itself. exited receives Wait's result (put it back after
// reading it).
func startChroot(t *testing.T, argv, env []string) (*exec.Cmd, *natstest.Buffer, chan error) {
	t.Helper()
	cmd := exec.Command("chroot", argv...)
	cmd.Env = env
	logs := new(natstest.Buffer)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case err := <-exited:
			exited <- err
		default:
			cmd.Process.Kill()
			exited <- <-exited
		}
	})
	return cmd, logs, exited
}

// podman runs podman and returns its standard output; a failure fails the
// test.
func podman(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "podman", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// podmanQuiet runs podman for a cleanup, ignoring its output.
func podmanQuiet(args ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exec.CommandContext(ctx, "podman", args...).Run()
}

// exportedEntries lists a container export: each path with "dir",
// "file", "exec" (a regular file anyone may execute) or its tar type.
func exportedEntries(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		switch {
		case h.Typeflag == tar.TypeDir:
			out[strings.TrimSuffix(name, "/")+"/"] = "dir"
		case h.Typeflag == tar.TypeReg && h.Mode&0o111 == 0o111:
			out[name] = "exec"
		case h.Typeflag == tar.TypeReg && h.Mode&0o444 == 0o444:
			out[name] = "file"
		default:
			out[name] = fmt.Sprintf("type %c mode %o", h.Typeflag, h.Mode)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, info.Mode().Perm()); err != nil {
		t.Fatal(err)
	}
}

func sameContent(t *testing.T, a, b string) bool {
	t.Helper()
	da, err := os.ReadFile(a)
	if err != nil {
		t.Error(err)
		return false
	}
	db, err := os.ReadFile(b)
	if err != nil {
		t.Error(err)
		return false
	}
	return string(da) == string(db)
}

func randomID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// freePort is a port nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// getStatus GETs url and wants code.
func getStatus(url string, code int) error {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != code {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}
