package embedded_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sotercare/jetbridge/internal/embedded"
)

// canary writes a file outside the store dir that an attacker would like
// the bridge to overwrite, and returns its path and content.
func canary(t *testing.T) (string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "canary")
	content := []byte("precious data, not a pid\n")
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, content
}

func wantUnchanged(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read canary: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("canary %s changed: %q, want %q", path, got, want)
	}
}

const unsafeHint = "; refusing to use it (the server creates its own lock file: remove this one, and make sure no other user can write to the store dir)"

// A lock file planted as a symbolic link (to a file the bridge's user can
// write) is never opened through: Start fails naming the path and the
// link, and the file it points to is unchanged. The same store dir works
// once the link is removed. TestLockFollowingLinksOverwritesTheCanary
// (lock_internal_test.go) is the control: opened without O_NOFOLLOW, the
// lock overwrites the canary.
func TestStartRefusesASymlinkedLockFile(t *testing.T) {
	dir := t.TempDir()
	target, content := canary(t)
	lock := filepath.Join(dir, "jetbridge.lock")
	if err := os.Symlink(target, lock); err != nil {
		t.Fatal(err)
	}

	s, err := embedded.Start(t.Context(), embedded.Options{StoreDir: dir})
	if s != nil {
		s.Shutdown()
		t.Fatal("Start returned a server on a store dir whose lock file is a symbolic link")
	}
	want := "embedded: store dir lock file " + lock + " is a symbolic link to " + target + unsafeHint
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v\nwant %s", err, want)
	}
	var unsafe *embedded.UnsafeLockFileError
	if !errors.Is(err, embedded.ErrUnsafeLockFile) || !errors.As(err, &unsafe) || unsafe.Path != lock {
		t.Fatalf("err = %#v, want an *UnsafeLockFileError for %s matching ErrUnsafeLockFile", err, lock)
	}
	wantUnchanged(t, target, content)
	if fi, err := os.Lstat(lock); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the planted link was replaced: %v, %v", fi, err)
	}

	// The refusal is about the link: without it the same dir starts.
	if err := os.Remove(lock); err != nil {
		t.Fatal(err)
	}
	start(t, embedded.Options{StoreDir: dir})
	wantUnchanged(t, target, content)
}

// Other lock files that are not the server's own are refused the same
// way, with nothing written: a named pipe, and a hard link to another
// file (O_NOFOLLOW does not see hard links).
func TestStartRefusesOtherUnsafeLockFiles(t *testing.T) {
	t.Run("named pipe", func(t *testing.T) {
		dir := t.TempDir()
		lock := filepath.Join(dir, "jetbridge.lock")
		if err := syscall.Mkfifo(lock, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := embedded.Start(t.Context(), embedded.Options{StoreDir: dir})
		want := "embedded: store dir lock file " + lock + " is not a regular file (a named pipe)" + unsafeHint
		if err == nil || err.Error() != want || !errors.Is(err, embedded.ErrUnsafeLockFile) {
			t.Fatalf("err = %v\nwant %s", err, want)
		}
	})
	t.Run("hard link", func(t *testing.T) {
		dir := t.TempDir()
		target, content := canary(t)
		lock := filepath.Join(dir, "jetbridge.lock")
		if err := os.Link(target, lock); err != nil {
			t.Skipf("hard link across temp dirs: %v", err)
		}
		_, err := embedded.Start(t.Context(), embedded.Options{StoreDir: dir})
		want := "embedded: store dir lock file " + lock + " is a regular file with 2 hard links" + unsafeHint
		if err == nil || err.Error() != want || !errors.Is(err, embedded.ErrUnsafeLockFile) {
			t.Fatalf("err = %v\nwant %s", err, want)
		}
		wantUnchanged(t, target, content)
	})
}
