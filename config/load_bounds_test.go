package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// loader reads and loads a configuration file: LoadFile, or a variant of
// it built from readBounded with other bounds (negative controls).
type loader func(path string) (*Config, error)

// boundedLoader is LoadFile with the given size limit and mode check.
func boundedLoader(limit int64, allowed func(fs.FileMode) bool) loader {
	return func(path string) (*Config, error) {
		data, err := readBounded(path, limit, allowed)
		if err != nil {
			return nil, err
		}
		return Load(data, path)
	}
}

func anyMode(fs.FileMode) bool { return true }

// refusedWith checks that load refuses path with an error matching want,
// naming the file, and saying what is wrong (what).
func refusedWith(load loader, path string, want error, what string) error {
	_, err := load(path)
	switch {
	case err == nil:
		return fmt.Errorf("%s loaded", path)
	case !errors.Is(err, want):
		return fmt.Errorf("%s: error %q, want %q", path, err, want)
	case !strings.HasPrefix(err.Error(), "config file "+path+": ") || !strings.Contains(err.Error(), what):
		return fmt.Errorf("error %q does not name the file and say %q", err, what)
	}
	return nil
}

// paddedConfig is a valid configuration padded with comment lines to at
// least size bytes.
func paddedConfig(size int) []byte {
	b := []byte(minimal)
	line := "# " + strings.Repeat("p", 97) + "\n"
	for len(b) < size {
		b = append(b, line...)
	}
	return b
}

// Directories, devices (/dev/zero would never end) and sockets are refused
// before they are read, with an error naming the file and its kind. The
// negative control reads them with the mode check disabled: /dev/zero is
// then read (up to the size bound), the others fail in some other way.
func TestLoadFileRefusesNonRegularFiles(t *testing.T) {
	sockDir, err := os.MkdirTemp("", "cfgsock") // short: socket paths are limited to ~100 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })

	cases := []struct{ name, path, what string }{
		{"device", "/dev/zero", "a character device"},
		{"directory", t.TempDir(), "a directory"},
		{"socket", sock, "a socket"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := os.Stat(c.path); err != nil {
				t.Skipf("%s: %v", c.path, err)
			}
			if err := refusedWith(LoadFile, c.path, ErrNotRegularFile, c.what); err != nil {
				t.Fatal(err)
			}
			expectRefusalBroken(t, "no mode check", func() error {
				return refusedWith(boundedLoader(MaxFileSize, anyMode), c.path, ErrNotRegularFile, c.what)
			})
		})
	}
}

// A regular file over MaxFileSize is refused from its size alone; one just
// under it loads. The negative control reads with no useful size limit.
func TestLoadFileSizeBound(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, paddedConfig(5<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := refusedWith(LoadFile, big, ErrFileTooLarge, "larger than the 4 MiB limit"); err != nil {
		t.Fatal(err)
	}
	under := filepath.Join(dir, "under.yaml")
	if err := os.WriteFile(under, paddedConfig(MaxFileSize-200), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(under); err != nil {
		t.Fatalf("a file under the limit: %v", err)
	}
	expectRefusalBroken(t, "no size limit", func() error {
		return refusedWith(boundedLoader(1<<40, configFileMode), big, ErrFileTooLarge, "larger than the 4 MiB limit")
	})
}

// fifoWith makes a named pipe and a writer that writes data into it once a
// reader opens it (LoadFile blocks until then).
func fifoWith(t *testing.T, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return
		}
		defer f.Close()
		_, _ = f.Write(data) // EPIPE once the reader has had enough
	}()
	t.Cleanup(func() {
		// A writer still waiting for a reader is released by one.
		if r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			r.Close()
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the FIFO writer did not finish")
		}
	})
	return path
}

// A named pipe (as /dev/stdin or <(...) give) is read until its writer
// closes it, and bounded like a file: 5 MB through a pipe is refused after
// MaxFileSize+1 bytes. The negative control reads it with no useful limit.
func TestLoadFileNamedPipe(t *testing.T) {
	cfg, err := LoadFile(fifoWith(t, []byte(minimal)))
	if err != nil {
		t.Fatalf("config from a FIFO: %v", err)
	}
	if cfg.Destinations["hook"] == nil || len(cfg.Routes) != 1 {
		t.Fatalf("config from a FIFO: %+v", cfg)
	}
	if err := refusedWith(LoadFile, fifoWith(t, paddedConfig(5<<20)), ErrFileTooLarge, "more than 4194304 bytes"); err != nil {
		t.Fatal(err)
	}
	expectRefusalBroken(t, "no size limit", func() error {
		return refusedWith(boundedLoader(1<<40, configFileMode), fifoWith(t, paddedConfig(5<<20)), ErrFileTooLarge, "more than 4194304 bytes")
	})
}

// A YAML alias bomb ("billion laughs": 10^10 strings from a few hundred
// bytes) where a list of strings is expected is refused without being
// expanded: one type error per element of the outer list, naming the file.
// (No configuration key takes nested lists or free-form values, and the
// YAML decoder also refuses excessive aliasing.)
func TestLoadRefusesAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("stream:\n  subjects: [\n")
	b.WriteString("    &a0 [x, x, x, x, x, x, x, x, x, x],\n")
	for i := 1; i <= 9; i++ {
		fmt.Fprintf(&b, "    &a%d [", i)
		for j := range 10 {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*a%d", i-1)
		}
		b.WriteString("],\n")
	}
	b.WriteString("  ]\n")
	b.WriteString(minimal)
	_, err := Load([]byte(b.String()), "bomb.yaml")
	if err == nil {
		t.Fatal("an alias bomb loaded")
	}
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Errors) != 10 || ve.Errors[0].File != "bomb.yaml" ||
		ve.Errors[0].Path != "stream.subjects[0]" {
		t.Fatalf("error %q, want 10 type errors in bomb.yaml from stream.subjects[0]", err)
	}
}

// expectRefusalBroken runs a check against a deliberately broken loader
// and fails if the check does not catch the break.
func expectRefusalBroken(t *testing.T, name string, check func() error) {
	t.Helper()
	t.Run("negative control: "+name, func(t *testing.T) {
		if err := check(); err == nil {
			t.Fatalf("the check passed against a deliberately broken loader (%s)", name)
		} else {
			t.Logf("caught, as it should: %v", err)
		}
	})
}
