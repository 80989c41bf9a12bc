package test

import (
	"context"
	"crypto/rand"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/producer"
)

// readmeSecret is the example signing secret of config/signed.yaml and
// docs/security.md.
const readmeSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// The two signing commands of
// docs/security.md#signed-deliveries-in-two-commands, with the real binary: `bridge
// receive --secret S` and the bridge on config/signed.yaml with
// JETBRIDGE_SIGNING_SECRET=S. The receiver verifies the signature of the
// delivery; a receiver holding another secret reports it invalid (the
// check can fail), and the secret never appears in the bridge's output.
func TestSigningWalkthrough(t *testing.T) {
	bin := bridgeBinary(t)
	signed := filepath.Join(moduleRoot(t), "config", "signed.yaml")
	for _, tc := range []struct {
		name, receiverSecret, want string
	}{
		{"same secret", readmeSecret, "signature=ok"},
		{"other secret", "whsec_" + strings.Repeat("QUJD", 8), "signature=INVALID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recvAddr := freeAddr(t)
			recv := startBridge(t, bin, []string{"receive", "--listen", recvAddr, "--secret", tc.receiverSecret})
			natstest.Eventually(t, readyTimeout, func() error {
				recv.failIfExited(t)
				if !strings.Contains(recv.stdout.String(), "receiving on") {
					return fmt.Errorf("receiver not listening yet")
				}
				return nil
			})

			natsAddr := freeAddr(t)
			env := []string{
				"JETBRIDGE_SIGNING_SECRET=" + readmeSecret,
				"JETBRIDGE_NATS_LISTEN=" + natsAddr,
				"JETBRIDGE_STORE_DIR=" + t.TempDir(),
				"JETBRIDGE_RECEIVER_URL=http://" + recvAddr + "/events",
				"JETBRIDGE_LOG_FORMAT=json",
				"JETBRIDGE_ADMIN_LISTEN=" + freeAddr(t),
			}
			b := startBridge(t, bin, []string{"run", "--config", signed}, env...)
			t.Setenv("JETBRIDGE_SIGNING_SECRET", readmeSecret)
			cfg, err := config.LoadFile(signed)
			if err != nil {
				t.Fatal(err)
			}
			_, js := b.waitReady(t, "nats://"+natsAddr, cfg.Stream.Name)

			id := "signed-" + rand.Text()
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if _, err := producer.NewPublisher(js, "events").Publish(ctx, producer.Event{
				ID: id, Type: "order.created", Payload: []byte(`{"order":42}`),
			}); err != nil {
				t.Fatalf("publish: %v", err)
			}
			natstest.Eventually(t, deliveryTimeout, func() error {
				for _, l := range strings.Split(recv.stdout.String(), "\n") {
					if strings.Contains(l, "id="+id) {
						if !strings.Contains(l, tc.want) {
							t.Fatalf("receiver line %q, want %s", l, tc.want)
						}
						return nil
					}
				}
				return fmt.Errorf("receiver has not printed %s yet", id)
			})
			if out := b.stdout.String() + b.stderr.String(); strings.Contains(out, strings.TrimPrefix(readmeSecret, "whsec_")) {
				t.Errorf("bridge output contains the signing secret")
			}
		})
	}
}

// config/signed.yaml has no default secret: without the variable it does
// not load, so a missing secret can never mean "unsigned".
func TestSignedConfigNeedsSecret(t *testing.T) {
	t.Setenv("JETBRIDGE_SIGNING_SECRET", "")
	_, err := config.LoadFile(filepath.Join(moduleRoot(t), "config", "signed.yaml"))
	if err == nil || !strings.Contains(err.Error(), "signing") && !strings.Contains(err.Error(), "JETBRIDGE_SIGNING_SECRET") {
		t.Fatalf("config/signed.yaml with an empty JETBRIDGE_SIGNING_SECRET: err %v, want an error naming the secret", err)
	}
}
