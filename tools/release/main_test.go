package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The archive is the same bytes whatever the files' times, modes and
// owners on disk and the order they are given in.
func TestWriteArchiveReproducible(t *testing.T) {
	mtime := time.Unix(1764759600, 0)
	write := func(order []string, fileTime time.Time, perm os.FileMode) []byte {
		dir := t.TempDir()
		var files []archiveFile
		for _, n := range order {
			p := filepath.Join(dir, n)
			if err := os.WriteFile(p, []byte("content of "+n), perm); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(p, fileTime, fileTime); err != nil {
				t.Fatal(err)
			}
			mode := int64(0o644)
			if n == "bridge" {
				mode = 0o755
			}
			files = append(files, archiveFile{Name: n, Path: p, Mode: mode})
		}
		var b bytes.Buffer
		if err := writeArchive(&b, files, mtime); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	a := write([]string{"bridge", "LICENSE", "README.md"}, time.Now(), 0o600)
	b := write([]string{"README.md", "LICENSE", "bridge"}, time.Unix(0, 0), 0o777)
	if !bytes.Equal(a, b) {
		t.Fatalf("two archives of the same files differ (%d and %d bytes)", len(a), len(b))
	}

	zr, err := gzip.NewReader(bytes.NewReader(a))
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("gzip header: name %q, mtime %v: want neither", zr.Name, zr.ModTime)
	}
	tr := tar.NewReader(zr)
	var got []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		want := int64(0o644)
		if h.Name == "bridge" {
			want = 0o755
		}
		if h.Mode != want || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(mtime) || string(data) != "content of "+h.Name {
			t.Errorf("%s: mode %o uid %d gid %d %q/%q mtime %v content %q", h.Name, h.Mode, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime, data)
		}
		got = append(got, h.Name)
	}
	if strings.Join(got, " ") != "LICENSE README.md bridge" {
		t.Errorf("entries %q, want sorted LICENSE README.md bridge", got)
	}
}

func TestChecksums(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"b.tar.gz", "a.tar.gz"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := checksums(dir, []string{"b.tar.gz", "a.tar.gz"})
	if err != nil {
		t.Fatal(err)
	}
	// sha256 of the texts "a.tar.gz" and "b.tar.gz", as sha256sum prints them, sorted by name.
	want := "0a67bba7da46793c9f1908a7eec3d06a11ba7bc00bf749c31bb134f4f45ebcad  a.tar.gz\n" +
		"4cdd590dab2a8c432f0e00ac86a0de7d0116b6638a012053786d3b4899102a74  b.tar.gz\n"
	if string(got) != want {
		t.Errorf("SHA256SUMS:\n%s\nwant:\n%s", got, want)
	}
}

// Bad flags exit 2 with one line; -h exits 0.
func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-platforms", "linux"}, 2, "release: -platforms: \"linux\" is not os/arch\n"},
		{[]string{"-platforms", "linux/amd64,linux/amd64"}, 2, "release: -platforms: linux/amd64 is listed twice\n"},
		{[]string{"-platforms", "linux/amd64,"}, 2, "release: -platforms: \"\" is not os/arch\n"},
		{[]string{"-out", ""}, 2, "release: -out: empty directory\n"},
		{[]string{"extra"}, 2, "release: unexpected argument \"extra\" (flags only)\n"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, &stdout, &stderr); code != tc.code || stderr.String() != tc.want || stdout.Len() != 0 {
			t.Errorf("release %q: exit %d, stderr %q, stdout %q; want exit %d, stderr %q", tc.args, code, stderr.String(), stdout.String(), tc.code, tc.want)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-nosuchflag"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "flag provided but not defined: -nosuchflag") {
		t.Errorf("-nosuchflag: exit %d, stderr %q", code, stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"-h"}, &stdout, &stderr); code != 0 || !strings.HasPrefix(stderr.String(), "Usage: go run ./tools/release") {
		t.Errorf("-h: exit %d, stderr %q", code, stderr.String())
	}
}
