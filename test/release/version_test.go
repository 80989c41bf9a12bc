package release

import (
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// mainModule is the module path of jetbridge.
const mainModule = "github.com/sotercare/jetbridge"

// versionKeys are the keys of `bridge version --json` (CONTRACT.md, 1).
var versionKeys = []string{"go", "modified", "nats_server", "revision", "time", "version"}

// versionInfo is `bridge version --json`.
type versionInfo struct {
	Version    string `json:"version"`
	Revision   string `json:"revision"`
	Time       string `json:"time"`
	Modified   bool   `json:"modified"`
	Go         string `json:"go"`
	NATSServer string `json:"nats_server"`
}

// bridgeVersion runs `bridge version --json` and decodes it, checking that
// it has the contract's keys and no others.
func bridgeVersion(t *testing.T, bridge string) versionInfo {
	t.Helper()
	out := mustRun(t, ".", nil, bridge, "version", "--json")
	var keys map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &keys); err != nil {
		t.Fatalf("bridge version --json: %v\n%s", err, out)
	}
	if got := slices.Sorted(maps.Keys(keys)); !slices.Equal(got, versionKeys) {
		t.Errorf("bridge version --json keys: %v, want %v", got, versionKeys)
	}
	var v versionInfo
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("bridge version --json: %v\n%s", err, out)
	}
	return v
}

// recorded is what Go recorded in a binary: the main module's version, the
// VCS settings, and the nats-server module's version without its "v" (as
// the server reports itself).
type recorded struct {
	version, revision, time, modified, natsServer string
}

func readRecorded(t *testing.T, bin string) recorded {
	t.Helper()
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	r := recorded{version: bi.Main.Version}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			r.revision = s.Value
		case "vcs.time":
			r.time = s.Value
		case "vcs.modified":
			r.modified = s.Value
		}
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/nats-io/nats-server/v2" {
			r.natsServer = strings.TrimPrefix(d.Version, "v")
		}
	}
	if r.natsServer == "" {
		t.Fatalf("%s: no nats-server module in its build information", bin)
	}
	return r
}

// A build of a tagged commit reports the tag, the commit and its time, an
// unmodified tree, the toolchain and the embedded nats-server, in JSON and
// in text, and so do publish and sotercare.
func TestVersionTagged(t *testing.T) {
	r := tagged(t)
	bridge := filepath.Join(r.bin, "bridge")
	rec := readRecorded(t, bridge)
	want := versionInfo{
		Version:    testTag,
		Revision:   r.revision,
		Time:       r.time.Format(time.RFC3339),
		Modified:   false,
		Go:         goEnv(t, r.dir, "GOVERSION"),
		NATSServer: rec.natsServer,
	}
	if got := bridgeVersion(t, bridge); got != want {
		t.Errorf("bridge version --json:\n got %+v\nwant %+v", got, want)
	}
	// Go recorded the same: the tag is what Go stamps, not something the
	// bridge made up.
	if rec.version != testTag || rec.revision != r.revision || rec.time != want.Time || rec.modified != "false" {
		t.Errorf("build information of bridge: %+v", rec)
	}

	text := mustRun(t, ".", nil, bridge, "version")
	wantText := fmt.Sprintf("jetbridge %s\nrevision %s\ntime %s\ngo %s\nnats-server %s (embedded)\n", testTag, r.revision, want.Time, want.Go, want.NATSServer)
	if text != wantText {
		t.Errorf("bridge version:\n%s\nwant:\n%s", text, wantText)
	}
	// --version: one line, the revision as pseudo-versions show it (12 hex).
	wantLine := fmt.Sprintf("jetbridge %s (revision %s, %s)\n", testTag, r.revision[:12], want.Time)
	for _, name := range []string{"bridge", "publish", "sotercare"} {
		if out := mustRun(t, ".", nil, filepath.Join(r.bin, name), "--version"); out != wantLine {
			t.Errorf("%s --version: %q, want %q", name, out, wantLine)
		}
	}
}

// An untagged commit after the tag gets a pseudo-version that names it; a
// modified tree is reported as modified, and its version says +dirty.
func TestVersionUntaggedAndModified(t *testing.T) {
	r := tagged(t)
	dir := filepath.Join(t.TempDir(), "clone")
	if err := cloneRepo(r.dir, dir); err != nil {
		t.Fatal(err)
	}
	mustRun(t, dir, nil, "git", "tag", testTag, r.revision)
	if err := os.WriteFile(filepath.Join(dir, "release-test.txt"), []byte("a commit after the tag\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, dir, nil, "git", "add", "release-test.txt")
	mustRun(t, dir, nil, "git", "commit", "--quiet", "-m", "a commit after the tag")
	rev, at, err := head(dir)
	if err != nil {
		t.Fatal(err)
	}
	// v0.99.0 -> v0.99.1-0.<commit time>-<12 hex of the revision>.
	pseudo := fmt.Sprintf("v0.99.1-0.%s-%s", at.Format("20060102150405"), rev[:12])
	goVersion := goEnv(t, dir, "GOVERSION")

	bin := t.TempDir()
	if err := buildBinaries(dir, bin, "./cmd/bridge"); err != nil {
		t.Fatal(err)
	}
	bridge := filepath.Join(bin, "bridge")
	nats := readRecorded(t, bridge).natsServer
	want := versionInfo{Version: pseudo, Revision: rev, Time: at.Format(time.RFC3339), Modified: false, Go: goVersion, NATSServer: nats}
	if got := bridgeVersion(t, bridge); got != want {
		t.Errorf("untagged commit: bridge version --json:\n got %+v\nwant %+v", got, want)
	}

	// A tracked file changed, not committed.
	f, err := os.OpenFile(filepath.Join(dir, "release-test.txt"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("a change not committed\n"); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := buildBinaries(dir, bin, "./cmd/bridge"); err != nil {
		t.Fatal(err)
	}
	want.Version, want.Modified = pseudo+"+dirty", true
	if got := bridgeVersion(t, bridge); got != want {
		t.Errorf("modified tree: bridge version --json:\n got %+v\nwant %+v", got, want)
	}
	wantLine := fmt.Sprintf("jetbridge %s+dirty (revision %s, %s, modified)\n", pseudo, rev[:12], want.Time)
	if out := mustRun(t, ".", nil, bridge, "--version"); out != wantLine {
		t.Errorf("modified tree: bridge --version: %q, want %q", out, wantLine)
	}
}

// `go install github.com/sotercare/jetbridge/cmd/bridge@v0.99.0` from a
// module proxy: the version is the module's; Go records no VCS information
// for a module built from the proxy, and the bridge says so (no revision,
// no time, not modified).
func TestVersionFromModuleProxy(t *testing.T) {
	r := tagged(t)
	tmp := t.TempDir()
	proxy := filepath.Join(tmp, "proxy")
	vdir := filepath.Join(proxy, filepath.FromSlash(mainModule), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		t.Fatal(err)
	}
	zf, err := os.Create(filepath.Join(vdir, testTag+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	if err := modzip.CreateFromVCS(zf, module.Version{Path: mainModule, Version: testTag}, r.dir, testTag, ""); err != nil {
		t.Fatal(err)
	}
	if err := zf.Close(); err != nil {
		t.Fatal(err)
	}
	gomod := mustRun(t, r.dir, nil, "git", "show", testTag+":go.mod")
	info, err := json.Marshal(struct{ Version, Time string }{testTag, r.time.Format(time.RFC3339)})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{testTag + ".mod": gomod, testTag + ".info": string(info), "list": testTag + "\n"} {
		if err := os.WriteFile(filepath.Join(vdir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// A module cache of its own, so that v0.99.0 of jetbridge never lands
	// in the user's: the dependencies come from the user's module cache
	// (which is laid out as a proxy) or else from the usual proxy.
	// -modcacherw lets the test remove it; -trimpath lets the build reuse
	// the build cache whatever the module cache's directory.
	cache := goEnv(t, ".", "GOMODCACHE")
	gobin := filepath.Join(tmp, "bin")
	env := []string{
		"GOPROXY=file://" + filepath.ToSlash(proxy) + ",file://" + filepath.ToSlash(filepath.Join(cache, "cache", "download")) + "," + goEnv(t, ".", "GOPROXY"),
		"GONOSUMDB=" + mainModule,
		"GOFLAGS=-mod=mod -modcacherw -trimpath",
		"GOMODCACHE=" + filepath.Join(tmp, "modcache"),
		"GOBIN=" + gobin,
	}
	mustRun(t, tmp, env, "go", "install", mainModule+"/cmd/bridge@"+testTag)
	bridge := filepath.Join(gobin, "bridge")
	rec := readRecorded(t, bridge)
	if rec.version != testTag || rec.revision != "" || rec.time != "" || rec.modified != "" {
		t.Errorf("build information of the installed bridge: %+v", rec)
	}
	want := versionInfo{Version: testTag, Go: goEnv(t, tmp, "GOVERSION"), NATSServer: rec.natsServer}
	if got := bridgeVersion(t, bridge); got != want {
		t.Errorf("go install @%s: bridge version --json:\n got %+v\nwant %+v", testTag, got, want)
	}
	if out := mustRun(t, ".", nil, bridge, "--version"); out != "jetbridge "+testTag+"\n" {
		t.Errorf("go install @%s: bridge --version: %q, want %q", testTag, out, "jetbridge "+testTag+"\n")
	}
}

// `go run ./cmd/bridge version --json` in the repository, as a user runs it
// (GOFLAGS unset, -buildvcs=auto): go run stamps no VCS information, the
// main module's version is "(devel)", and the bridge invents none.
func TestVersionGoRun(t *testing.T) {
	out := mustRun(t, repoRoot, vcsBuildEnv, "go", "run", "./cmd/bridge", "version", "--json")
	var got versionInfo
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("go run ./cmd/bridge version --json: %v\n%s", err, out)
	}
	want := versionInfo{Version: "(devel)", Go: goEnv(t, repoRoot, "GOVERSION"), NATSServer: got.NATSServer}
	if got != want || got.NATSServer == "" {
		t.Errorf("go run ./cmd/bridge version --json:\n got %+v\nwant %+v (nats_server not empty)", got, want)
	}
}
