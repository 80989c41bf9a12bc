package main

import (
	"os"
	"path/filepath"
	"testing"
)

// A stopped bridge's store whose lock file was replaced by a symbolic
// link: a dlq command refuses (exit 1) naming the file, serves nothing
// and leaves the link's target unchanged. Control: the same store with
// the link removed is served (the dead-letter stream is missing there,
// which only a served store can tell).
func TestDLQRefusesASymlinkedLockFile(t *testing.T) {
	unsetenv(t, "NATS_URL")
	unsetenv(t, "BRIDGE_CONFIG")
	store := t.TempDir()
	if err := os.Mkdir(filepath.Join(store, "jetstream"), 0o700); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "canary")
	content := []byte("precious data, not a pid\n")
	if err := os.WriteFile(target, content, 0o600); err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(store, "jetbridge.lock")
	if err := os.Symlink(target, lock); err != nil {
		t.Fatal(err)
	}
	cfg := writeRunConfig(t, "", freePort(t), store, "")
	stderr := runFails(t, 1, "dlq", "list", "--config", cfg)
	want := "bridge: nats.embedded.store_dir " + store + ": cannot serve it for this command: store dir lock file " + lock +
		" is a symbolic link to " + target + "; refusing to use it (the server creates its own lock file: remove this one, " +
		"and make sure no other user can write to the store dir)\n"
	if stderr != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", stderr, want)
	}
	if got, err := os.ReadFile(target); err != nil || string(got) != string(content) {
		t.Errorf("canary = %q, %v; want it unchanged, %q", got, err, content)
	}

	if err := os.Remove(lock); err != nil {
		t.Fatal(err)
	}
	stderr = runFails(t, 1, "dlq", "list", "--config", cfg)
	if want := "bridge: dead-letter stream EVENTS_DLQ does not exist (has the bridge run with this configuration?)\n"; stderr != want {
		t.Errorf("control, without the link: stderr:\n%s\nwant:\n%s", stderr, want)
	}
}
