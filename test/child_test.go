package test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/sotercare/jetbridge/internal/embedded"
	"github.com/sotercare/jetbridge/internal/natstest"
)

// Child-process roles of the reliability scenarios (natstest.StartChild
// re-executes this test binary). The bridge itself always runs as the real
// binary (runBridge), so that its signal handling, NATS connection options
// and admin server are the ones users get.

// natsdRole runs an embedded JetStream server on $JETBRIDGE_TEST_NATS_LISTEN
// with the store dir $JETBRIDGE_TEST_STORE_DIR, prints "natsd ready", and
// runs until it is killed, or shuts down cleanly on SIGTERM.
const natsdRole = "natsd"

func TestChildNatsd(t *testing.T) {
	if natstest.ChildRole() != natsdRole {
		t.Skip("runs only as a child process of a server-crash test")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	srv, err := embedded.Start(ctx, embedded.Options{
		Listen:     os.Getenv("JETBRIDGE_TEST_NATS_LISTEN"),
		StoreDir:   os.Getenv("JETBRIDGE_TEST_STORE_DIR"),
		ServerName: "natsd-child",
	})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("natsd ready")
	<-ctx.Done()
	srv.Shutdown()
}
