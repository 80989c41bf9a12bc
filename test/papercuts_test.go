package test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// Issue 27's papercuts that need the real binary.

// bridge receive --listen PORT listens on 127.0.0.1:PORT and says so.
func TestReceiveBarePort(t *testing.T) {
	addr := freeAddr(t)
	_, port, _ := strings.Cut(addr, ":")
	c := startBridge(t, bridgeBinary(t), []string{"receive", "--listen", port})
	want := "receiving on http://" + addr + "/ (answering 202, failing 0% with 503); Ctrl-C to stop\n"
	natstest.Eventually(t, readyTimeout, func() error {
		c.failIfExited(t)
		resp, err := http.Post("http://"+addr+"/events", "application/json", strings.NewReader(`{}`))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("status %d, want 202", resp.StatusCode)
		}
		return nil
	})
	if got, _, _ := strings.Cut(c.stdout.String(), "\n"); got+"\n" != want {
		t.Errorf("first line %q, want %q", got, want)
	}
}
