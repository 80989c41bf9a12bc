package config

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// fileConfig reads nats.password and four headers from files.
const fileConfig = `nats:
  url: nats://127.0.0.1:4222
  user: bridge
  password: ${file:${CREDENTIALS_DIRECTORY}/nats-password}
destinations:
  hook:
    url: http://127.0.0.1:9091/hook
    headers:
      X-Crlf: ${file:secrets/crlf}
      X-Twice: "${file:twice}"
      X-None: 'pre-${file:none}-post'
      X-Linked: ${file:linked}
routes:
  - name: r
    subjects: ["events.>"]
    destination: hook
`

func TestFileReferences(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(t.TempDir(), "credentials")
	writeFile(t, filepath.Join(creds, "nats-password"), "*pw #x\n  y: z\n")
	writeFile(t, filepath.Join(dir, "secrets", "crlf"), "crlf-value\r\n")
	writeFile(t, filepath.Join(dir, "twice"), "twice\n\n")
	writeFile(t, filepath.Join(dir, "none"), "none")
	// A Kubernetes Secret volume: the file is a symbolic link.
	writeFile(t, filepath.Join(dir, "..data", "linked"), "linked\n")
	if err := os.Symlink(filepath.Join("..data", "linked"), filepath.Join(dir, "linked")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "bridge.yaml")
	writeFile(t, path, strings.Replace(fileConfig, "X-Twice", "X-Two", 1))
	t.Setenv("CREDENTIALS_DIRECTORY", creds)

	c, err := LoadFile(path) // relative paths are relative to the file's directory
	if err == nil || err.Error() != path+":10: destinations.hook.headers.X-Two: the value contains a line break or NUL" {
		t.Fatalf("got %v, want the one line break left of twice's two", err)
	}
	writeFile(t, path, fileConfig)
	writeFile(t, filepath.Join(dir, "twice"), "twice\n")
	if c, err = LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if got := c.NATS.Password.Value(); got != "*pw #x\n  y: z" {
		t.Errorf("password %q: want the file's text without its last newline", got)
	}
	want := map[string]string{"X-Crlf": "crlf-value", "X-Twice": "twice", "X-None": "pre-none-post", "X-Linked": "linked"}
	h := c.Destinations["hook"].Headers
	if len(h) != len(want) {
		t.Errorf("headers %v", h)
	}
	for k, v := range want {
		if h[k].Value() != v {
			t.Errorf("%s = %q, want %q", k, h[k].Value(), v)
		}
	}
}

func TestFileReferenceBoundary(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "max"), strings.Repeat("k", MaxSecretFileSize))
	c, err := loadWith([]byte(strings.Replace(natsPassword, "${PW}", "${file:max}", 1)), filepath.Join(dir, "b.yaml"), lookupIn(nil))
	if err != nil || len(c.NATS.Password.Value()) != MaxSecretFileSize {
		t.Fatalf("a file of exactly %d bytes: %v", MaxSecretFileSize, err)
	}
}

func TestFileReferenceErrors(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "big"), strings.Repeat("s", MaxSecretFileSize+1))
	writeFile(t, filepath.Join(dir, "secret"), "top-secret-content\n")
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "bridge.yaml")
	tests := []struct {
		name, ref, want string
	}{
		{"missing", "${file:missing}", "${file:" + dir + "/missing}: no such file"},
		{"missing absolute", "${file:/nonexistent/dir/pw}", "${file:/nonexistent/dir/pw}: no such file"},
		{"a directory", "${file:.}", "${file:" + dir + "}: is a directory, not a file"},
		{"too large", "${file:big}", "${file:" + dir + "/big}: is larger than the 64 KiB limit"},
		{"a named pipe", "${file:fifo}", "${file:" + dir + "/fifo}: is a named pipe, not a regular file"},
		{"no path", "${file:}", "${file:} needs a path"},
		{"unset variable in the path", "${file:${CREDS_UNSET}/pw}", "environment variable CREDS_UNSET is not set (in the path of ${file:...})"},
		{"a file in the path", "${file:${file:secret}}", "a ${file:...} is not supported (in the path of ${file:...})"},
		{"unterminated", "${file:secret", "unterminated ${ (write $${ for a literal ${)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			yml := strings.Replace(natsPassword, "${PW}", tt.ref, 1)
			_, err := loadWith([]byte(yml), src, lookupIn(nil))
			want := src + ":4: nats.password: " + tt.want
			if err == nil || err.Error() != want {
				t.Fatalf("got  %v\nwant %s", err, want)
			}
			if strings.Contains(err.Error(), "top-secret-content") {
				t.Fatal("the error shows the content")
			}
		})
	}

	t.Run("unreadable", func(t *testing.T) {
		p := filepath.Join(dir, "unreadable")
		writeFile(t, p, "x")
		if err := os.Chmod(p, 0); err != nil {
			t.Fatal(err)
		}
		if f, err := os.Open(p); err == nil { // root reads it anyway
			f.Close()
			t.Skip("this user can read a file of mode 000")
		}
		_, err := loadWith([]byte(strings.Replace(natsPassword, "${PW}", "${file:unreadable}", 1)), src, lookupIn(nil))
		want := src + ":4: nats.password: ${file:" + p + "}: permission denied"
		if err == nil || err.Error() != want {
			t.Fatalf("got  %v\nwant %s", err, want)
		}
	})
}

// Resolving never moves a line: a value of several lines, from a file or
// the environment, leaves the line of every later error where it was.
func TestLinesAfterResolving(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "multi"), "a\nb\nc\nd\n")
	yml := "nats:\n  url: nats://127.0.0.1:4222\n  user: bridge\n  password: ${file:multi}\n  token: |\n    ${MULTI}\n" +
		minimal + "    max_deliver: 0\n    ack_wait: ${MULTI}\n"
	_, err := loadWith([]byte(yml), filepath.Join(dir, "b.yaml"), lookupIn(map[string]string{"MULTI": "1\n2\n3"}))
	// Every problem of the file, each on its line.
	want := filepath.Join(dir, "b.yaml") + ":5: nats.token: cannot be combined with nats.user: set at most one of creds_file, nkey_seed_file, user+password, token\n" +
		filepath.Join(dir, "b.yaml") + ":14: routes[0].max_deliver: must be at least 1, got 0\n" +
		filepath.Join(dir, "b.yaml") + ":15: routes[0].ack_wait: the value of ${MULTI} is not a Go duration such as 250ms or 2m"
	if err == nil || err.Error() != want {
		t.Fatalf("got  %v\nwant %s", err, want)
	}
	_, err = loadWith([]byte(strings.Replace(yml, "${MULTI}\n", "1s\n", 2)), filepath.Join(dir, "b.yaml"), lookupIn(nil))
	want = filepath.Join(dir, "b.yaml") + ":14: routes[0].max_deliver: must be at least 1, got 0"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got  %v\nwant a line %s", err, want)
	}
}
