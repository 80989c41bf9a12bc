package main

import (
	"os"
	"path/filepath"
	"testing"
)

// A lock file planted in the store dir as a symbolic link: bridge run
// exits 1 before anything starts, saying which file and why, and the file
// the link points to is unchanged.
func TestRunRefusesASymlinkedLockFile(t *testing.T) {
	unsetenv(t, "NATS_URL")
	store := t.TempDir()
	target := filepath.Join(t.TempDir(), "canary")
	content := []byte("precious data, not a pid\n")
	if err := os.WriteFile(target, content, 0o600); err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(store, "jetbridge.lock")
	if err := os.Symlink(target, lock); err != nil {
		t.Fatal(err)
	}
	stderr := runFails(t, 1, "run", "--config", writeRunConfig(t, "", freePort(t), store, ""))
	want := "bridge: embedded JetStream: store dir lock file " + lock + " is a symbolic link to " + target +
		"; refusing to use it (the server creates its own lock file: remove this one, and make sure no other user can write to the store dir)\n"
	if stderr != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", stderr, want)
	}
	if got, err := os.ReadFile(target); err != nil || string(got) != string(content) {
		t.Errorf("canary = %q, %v; want it unchanged, %q", got, err, content)
	}
}
