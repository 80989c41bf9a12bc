package embedded

import (
	"errors"
	"testing"
)

func TestParseListen(t *testing.T) {
	tests := []struct {
		name     string
		listen   string
		allow    bool
		wantHost string
		wantPort int
		wantErr  error // nil: no error; errAny: some error
	}{
		{name: "empty is random loopback", listen: "", wantHost: "127.0.0.1"},
		{name: "empty host", listen: ":4222", wantHost: "127.0.0.1", wantPort: 4222},
		{name: "empty port", listen: "127.0.0.1:", wantHost: "127.0.0.1"},
		{name: "port zero", listen: "127.0.0.1:0", wantHost: "127.0.0.1"},
		{name: "localhost", listen: "localhost:4222", wantHost: "127.0.0.1", wantPort: 4222},
		{name: "other loopback v4", listen: "127.0.0.2:1", wantHost: "127.0.0.2", wantPort: 1},
		{name: "loopback v6", listen: "[::1]:0", wantHost: "::1"},
		{name: "any v4", listen: "0.0.0.0:4222", wantErr: ErrNotLoopback},
		{name: "any v6", listen: "[::]:4222", wantErr: ErrNotLoopback},
		{name: "private", listen: "10.0.0.1:4222", wantErr: ErrNotLoopback},
		{name: "hostname", listen: "nats.example.com:4222", wantErr: ErrNotLoopback},
		{name: "allowed any", listen: "0.0.0.0:4222", allow: true, wantHost: "0.0.0.0", wantPort: 4222},
		{name: "allowed hostname", listen: "nats.example.com:1", allow: true, wantHost: "nats.example.com", wantPort: 1},
		{name: "missing port", listen: "127.0.0.1", wantErr: errAny},
		{name: "bad port", listen: "127.0.0.1:http", wantErr: errAny},
		{name: "port too big", listen: "127.0.0.1:65536", wantErr: errAny},
		{name: "negative port", listen: "127.0.0.1:-1", wantErr: errAny},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			host, port, err := parseListen(tt.listen, tt.allow)
			switch {
			case tt.wantErr == errAny:
				if err == nil {
					t.Fatalf("parseListen(%q) = %q, %d; want an error", tt.listen, host, port)
				}
				return
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("parseListen(%q) err = %v, want %v", tt.listen, err, tt.wantErr)
				}
				return
			case err != nil:
				t.Fatalf("parseListen(%q): %v", tt.listen, err)
			}
			if host != tt.wantHost || port != tt.wantPort {
				t.Fatalf("parseListen(%q) = %q, %d; want %q, %d", tt.listen, host, port, tt.wantHost, tt.wantPort)
			}
		})
	}
}

var errAny = errors.New("any error")
