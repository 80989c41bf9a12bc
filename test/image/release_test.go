// Package image tests what jetbridge ships: the release archives that
// tools/release writes, and the container image the Containerfile builds
// from them. Both build the real binaries (one platform, the test
// machine's linux/GOARCH, to keep it short) and look at the real results.
package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// root is the repository, from this package's directory.
var root = func() string {
	r, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		panic(err)
	}
	return r
}()

// platform is the one platform the tests build: the machine's own, so
// the binaries run here.
var platform = "linux/" + runtime.GOARCH

// inCI: with CI=true a missing tool fails the test instead of skipping it.
var inCI = os.Getenv("CI") == "true"

// unavailable skips the test, or fails it in CI.
func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	if inCI {
		t.Fatalf(format+" (CI=true: this must run in CI)", args...)
	}
	t.Skipf(format, args...)
}

// git runs git in the repository.
func git(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// requireClone skips (fails in CI) where the release tool cannot work: a
// linked git worktree, whose version Go cannot stamp (golang/go#58218).
func requireClone(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		unavailable(t, "git is not installed (Debian package git)")
	}
	dirs := strings.Fields(git(t, "rev-parse", "--path-format=absolute", "--git-dir", "--git-common-dir"))
	if len(dirs) != 2 || dirs[0] != dirs[1] {
		unavailable(t, "%s is a linked git worktree: Go stamps no version there (golang/go#58218) and tools/release refuses it; run this test in a clone", root)
	}
}

// release runs the release tool for the test platform into out and
// returns its standard output.
func release(t *testing.T, out string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", "./tools/release", "-out", out, "-platforms", platform)
	cmd.Dir = root
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("go run ./tools/release -out %s -platforms %s: %v\nstdout:\n%s\nstderr:\n%s", out, platform, err, stdout.String(), stderr.String())
	}
	t.Logf("go run ./tools/release -platforms %s: %s", platform, time.Since(start).Round(time.Second))
	if s := stderr.String(); s != "" {
		t.Logf("release tool stderr:\n%s", s)
	}
	return stdout.String()
}

// shared is one release build for the package's tests: the archive test
// builds a second one to compare, the image test reuses this one.
var shared struct {
	once sync.Once
	dir  string
	out  string
	err  error
}

func sharedRelease(t *testing.T) (dir, stdout string) {
	t.Helper()
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "jetbridge-release-")
		if shared.err != nil {
			return
		}
		ok := false
		t.Run("release", func(t *testing.T) {
			shared.out = release(t, shared.dir)
			ok = true
		})
		if !ok {
			shared.err = fmt.Errorf("the release build failed (see the release subtest)")
		}
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.dir, shared.out
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// buildVersion is the main module version Go stamped into a binary.
func buildVersion(t *testing.T, path string) string {
	t.Helper()
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Main.Version
}

// archiveEntry is one tar entry with its content.
type archiveEntry struct {
	hdr  *tar.Header
	data []byte
}

// readArchive reads a .tar.gz and its gzip header.
func readArchive(t *testing.T, path string) (gzip.Header, []archiveEntry) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var entries []archiveEntry
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, archiveEntry{hdr, data})
	}
	return zr.Header, entries
}

// The release tool, run twice on the same commit, writes byte-identical
// archives and checksums; the archive holds exactly the expected entries,
// reproducibly stamped, and its bridge reports the commit it was built
// from.
func TestReleaseArchive(t *testing.T) {
	requireClone(t)
	head := git(t, "rev-parse", "HEAD")
	commitTime, err := strconv.ParseInt(git(t, "log", "-1", "--format=%ct"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	dirty := git(t, "status", "--porcelain") != ""

	first, stdout := sharedRelease(t)
	second := t.TempDir()
	release(t, second)

	osArch := strings.ReplaceAll(platform, "/", "_")
	version := buildVersion(t, filepath.Join(first, osArch, "bridge"))
	if !strings.HasPrefix(version, "v") || strings.HasSuffix(version, "+dirty") != dirty {
		t.Errorf("version %q: want a module version, with +dirty exactly when the tree has changes (dirty: %t)", version, dirty)
	}
	name := fmt.Sprintf("jetbridge_%s_%s.tar.gz", version, osArch)

	// What it printed.
	wantOut := fmt.Sprintf("version %s (commit time %s)\nwrote %s\nwrote %s\nwrote %s\n",
		version, time.Unix(commitTime, 0).UTC().Format(time.RFC3339),
		filepath.Join(first, osArch)+"/", filepath.Join(first, name), filepath.Join(first, "SHA256SUMS"))
	if stdout != wantOut {
		t.Errorf("release tool output:\n%s\nwant:\n%s", stdout, wantOut)
	}

	// Byte-identical twice.
	sums1, err := os.ReadFile(filepath.Join(first, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	sums2, err := os.ReadFile(filepath.Join(second, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(sums1, sums2) {
		t.Errorf("SHA256SUMS differ between two runs:\n%s\n%s", sums1, sums2)
	}
	a1, err := os.ReadFile(filepath.Join(first, name))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := os.ReadFile(filepath.Join(second, name))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a1, a2) {
		t.Errorf("%s differs between two runs (%d and %d bytes)", name, len(a1), len(a2))
	}
	sum := sha256.Sum256(a1)
	if want := hex.EncodeToString(sum[:]) + "  " + name + "\n"; string(sums1) != want {
		t.Errorf("SHA256SUMS:\n%s\nwant:\n%s", sums1, want)
	}
	// sha256sum -c, as the docs tell users to verify.
	if _, err := exec.LookPath("sha256sum"); err == nil {
		cmd := exec.Command("sha256sum", "-c", "SHA256SUMS")
		cmd.Dir = first
		if out, err := cmd.CombinedOutput(); err != nil || string(out) != name+": OK\n" {
			t.Errorf("sha256sum -c SHA256SUMS: %v\n%s", err, out)
		}
	}

	// The archive's entries, sorted, reproducibly stamped.
	zh, entries := readArchive(t, filepath.Join(first, name))
	if zh.Name != "" || !zh.ModTime.IsZero() || zh.Comment != "" || zh.Extra != nil {
		t.Errorf("gzip header: name %q, mtime %v, comment %q, extra %q: want none", zh.Name, zh.ModTime, zh.Comment, zh.Extra)
	}
	want := []string{"CHANGELOG.md", "LICENSE", "README.md", "THIRD_PARTY_LICENSES", "bridge", "publish", "sotercare"}
	var names []string
	for _, e := range entries {
		h := e.hdr
		names = append(names, h.Name)
		mode := int64(0o644)
		if slices.Contains([]string{"bridge", "publish", "sotercare"}, h.Name) {
			mode = 0o755
		}
		if h.Typeflag != tar.TypeReg || h.Mode != mode || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || h.ModTime.Unix() != commitTime {
			t.Errorf("%s: type %c mode %o uid %d gid %d uname %q gname %q mtime %d; want a regular file, mode %o, 0/0 without names, mtime %d (the commit time)",
				h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime.Unix(), mode, commitTime)
		}
		switch h.Name {
		case "CHANGELOG.md", "LICENSE", "README.md":
			repo, err := os.ReadFile(filepath.Join(root, h.Name))
			if err != nil || !bytes.Equal(repo, e.data) {
				t.Errorf("%s: the archive's copy differs from the repository's (%v)", h.Name, err)
			}
		case "bridge", "publish", "sotercare", "THIRD_PARTY_LICENSES":
			built, err := os.ReadFile(filepath.Join(first, osArch, h.Name))
			if err != nil || !bytes.Equal(built, e.data) {
				t.Errorf("%s: the archive's copy differs from %s (%v)", h.Name, filepath.Join(first, osArch, h.Name), err)
			}
		}
	}
	if !slices.Equal(names, want) {
		t.Errorf("archive entries %q, want %q (LICENSE, README.md and CHANGELOG.md must exist at the repository root)", names, want)
	}

	// THIRD_PARTY_LICENSES names every module linked into the binaries.
	licences, err := os.ReadFile(filepath.Join(first, osArch, "THIRD_PARTY_LICENSES"))
	if err != nil {
		t.Fatal(err)
	}
	for _, cmdName := range []string{"bridge", "publish", "sotercare"} {
		info, err := buildinfo.ReadFile(filepath.Join(first, osArch, cmdName))
		if err != nil {
			t.Fatal(err)
		}
		for _, dep := range info.Deps {
			m := dep
			heading := "\n## " + m.Path + " " + m.Version
			if m.Replace != nil {
				heading += " => " + strings.TrimSpace(m.Replace.Path+" "+m.Replace.Version)
			}
			if !bytes.Contains(licences, []byte(heading+"\n")) {
				t.Errorf("THIRD_PARTY_LICENSES has no heading %q for a module linked into %s", strings.TrimSpace(heading), cmdName)
			}
		}
	}
	if !bytes.Contains(licences, []byte("\n## std (the Go standard library and runtime, "+runtime.Version()+")\n")) {
		t.Errorf("THIRD_PARTY_LICENSES lacks the Go standard library's licence")
	}

	// The bridge in the archive says what it was built from.
	i := slices.IndexFunc(entries, func(e archiveEntry) bool { return e.hdr.Name == "bridge" })
	if i < 0 {
		t.Fatal("no bridge in the archive")
	}
	exe := filepath.Join(t.TempDir(), "bridge")
	if err := os.WriteFile(exe, entries[i].data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(exe, "version", "--json").Output()
	if err != nil {
		t.Fatalf("bridge version --json: %v", err)
	}
	var v struct {
		Version, Revision, Time, Go string
		Modified                    bool
		NATSServer                  string `json:"nats_server"`
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("bridge version --json: %v\n%s", err, out)
	}
	wantTime := time.Unix(commitTime, 0).UTC().Format(time.RFC3339)
	if v.Version != version || v.Revision != head || v.Time != wantTime || v.Modified != dirty || v.Go != runtime.Version() || v.NATSServer == "" {
		t.Errorf("bridge version --json: %s\nwant version %s, revision %s, time %s, modified %t, go %s, a nats_server version",
			out, version, head, wantTime, dirty, runtime.Version())
	}
}
