package embedded

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// The control of TestStartRefusesASymlinkedLockFile: the same planted
// link, opened with the flags the lock used before (no O_NOFOLLOW), makes
// the lock truncate the canary and write this process's id into it. So
// the test detects the harm, and O_NOFOLLOW is what prevents it.
func TestLockFollowingLinksOverwritesTheCanary(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "canary")
	if err := os.WriteFile(target, []byte("precious data, not a pid\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, lockFile)); err != nil {
		t.Fatal(err)
	}
	l, err := lockStoreDirWith(dir, os.O_RDWR|os.O_CREATE)
	if err != nil {
		t.Fatalf("lock without O_NOFOLLOW: %v", err)
	}
	defer l.release()
	got, err := os.ReadFile(target)
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(os.Getpid()) + "\n"; string(got) != want {
		t.Fatalf("canary = %q, want it overwritten with %q", got, want)
	}
}
