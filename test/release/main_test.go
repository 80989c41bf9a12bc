package release

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// workDir holds what the tests of this package share: the tagged clone and
// its binaries, built once per run. TestMain removes it.
var workDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "jetbridge-release-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workDir = dir
	code := m.Run()
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// run runs a command in dir with env added to this process's environment
// (a later entry wins) and returns its standard output; a failure is an
// error that carries the standard error.
func run(dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s (in %s): %v\n%s", name, strings.Join(args, " "), dir, err, stderr.Bytes())
	}
	return stdout.String(), nil
}

// mustRun is run for a test: a failure ends it.
func mustRun(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	out, err := run(dir, env, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// vcsBuildEnv is the environment of a build that stamps VCS information as
// on a user's machine: these machines set GOFLAGS=-buildvcs=false, which a
// release build must not inherit (the builds pass -buildvcs=true as well).
var vcsBuildEnv = []string{"GOFLAGS="}

// git runs git in dir.
func git(dir string, args ...string) (string, error) {
	return run(dir, nil, "git", args...)
}

// testTag is the tag of the test release, in a clone only.
const testTag = "v0.99.0"

// release is a clone of the repository with binaries built in it.
type release struct {
	dir      string    // the clone
	bin      string    // bridge, publish, sotercare
	revision string    // the clone's HEAD
	time     time.Time // HEAD's commit time
}

// cloneRepo clones the repository's HEAD into dir, without its tags, and
// sets a committer identity there.
func cloneRepo(src, dir string) error {
	if _, err := git(".", "clone", "--quiet", "--no-tags", src, dir); err != nil {
		return err
	}
	for _, kv := range [][2]string{{"user.email", "release-test@example.com"}, {"user.name", "release test"}, {"commit.gpgsign", "false"}, {"tag.gpgsign", "false"}} {
		if _, err := git(dir, "config", kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}

// head returns the revision and commit time of HEAD in dir.
func head(dir string) (rev string, at time.Time, err error) {
	out, err := git(dir, "log", "-1", "--format=%H %ct")
	if err != nil {
		return "", time.Time{}, err
	}
	rev, unix, _ := strings.Cut(strings.TrimSpace(out), " ")
	sec, err := strconv.ParseInt(unix, 10, 64)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("git log: commit time %q: %w", unix, err)
	}
	return rev, time.Unix(sec, 0).UTC(), nil
}

// buildBinaries builds the given commands of the module in dir into bin,
// stamping VCS information. -trimpath, as a release build uses it, changes
// nothing that is stamped; it keeps the build cache's entries independent
// of the clone's and the module cache's directories, so that the clones of
// this package and the go install from the proxy share one compilation of
// the dependencies.
func buildBinaries(dir, bin string, cmds ...string) error {
	args := append([]string{"build", "-buildvcs=true", "-trimpath", "-o", bin + string(filepath.Separator)}, cmds...)
	_, err := run(dir, vcsBuildEnv, "go", args...)
	return err
}

// taggedRelease clones the repository's HEAD, tags it testTag and builds
// the three binaries there, once per run.
var taggedRelease = sync.OnceValues(func() (*release, error) {
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		return nil, err
	}
	r := &release{dir: filepath.Join(workDir, "tagged"), bin: filepath.Join(workDir, "tagged-bin")}
	if err := cloneRepo(root, r.dir); err != nil {
		return nil, err
	}
	if _, err := git(r.dir, "tag", testTag); err != nil {
		return nil, err
	}
	if r.revision, r.time, err = head(r.dir); err != nil {
		return nil, err
	}
	if err := buildBinaries(r.dir, r.bin, releasedPackages...); err != nil {
		return nil, err
	}
	return r, nil
})

// tagged is taggedRelease for a test.
func tagged(t *testing.T) *release {
	t.Helper()
	r, err := taggedRelease()
	if err != nil {
		t.Fatalf("the tagged release: %v", err)
	}
	return r
}

// goEnv returns `go env NAME` run in dir.
func goEnv(t *testing.T, dir, name string) string {
	t.Helper()
	return strings.TrimSpace(mustRun(t, dir, nil, "go", "env", name))
}
