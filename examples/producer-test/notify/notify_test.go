package notify_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"example.com/producer-test/notify"
	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/jetbridgetest"
	"github.com/sotercare/jetbridge/producer"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// start serves a notify.Handler verifying with receiverSecret and runs a
// bridge that signs with secret and delivers every event to it.
func start(t *testing.T, receiverSecret string) (*jetbridgetest.Server, *jetbridgetest.Bridge, *notify.Handler) {
	t.Helper()
	h, err := notify.NewHandler(receiverSecret)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	srv := jetbridgetest.NewServer(t)
	b := jetbridgetest.StartBridge(t, srv, fmt.Sprintf(`
destinations:
  notify:
    url: %s/hooks/orders
    signing: {secret: [%q]}
routes:
  - {name: notify, subjects: ["events.>"], destination: notify}
`, hs.URL, secret))
	return srv, b, h
}

func order(id string, cents int) producer.Event {
	return producer.Event{ID: id, Type: "order.created", Payload: fmt.Appendf(nil, `{"id":%q,"cents":%d}`, id, cents)}
}

func TestAcceptsSignedOrders(t *testing.T) {
	t.Parallel()
	srv, b, h := start(t, secret)
	for _, id := range []string{"a", "b", "c"} {
		srv.Publish(t, order(id, 100))
	}
	b.WaitSettled(t, 3, bridge.OutcomeDelivered)
	if got := h.Orders(); len(got) != 3 {
		t.Fatalf("accepted %v, want 3 orders", got)
	}
}

// The same event delivered twice (here: published under two message ids,
// as two producer replicas might) is accepted once.
func TestIgnoresSecondDeliveryOfAnEvent(t *testing.T) {
	t.Parallel()
	srv, b, h := start(t, secret)
	srv.Publish(t, order("d", 100))
	srv.Publish(t, order("d", 100), jetbridgetest.WithHeader(jetstream.MsgIDHeader, "d-from-replica-2"))
	b.WaitSettled(t, 2, bridge.OutcomeDelivered)
	if got := h.Orders(); len(got) != 1 {
		t.Fatalf("accepted %v, want the order once", got)
	}
}

// An order the receiver cannot use is refused with 422: the bridge
// dead-letters it on the first delivery, payload intact.
func TestRejectedOrderIsDeadLettered(t *testing.T) {
	t.Parallel()
	srv, b, h := start(t, secret)
	srv.Publish(t, order("free", 0))
	dl := b.WaitDeadLetters(t, 1)
	if dl[0].EventID != "free" || dl[0].Reason != deadletter.ReasonRejected || dl[0].Status != http.StatusUnprocessableEntity {
		t.Fatalf("dead letter %s: reason %s status %d", dl[0].EventID, dl[0].Reason, dl[0].Status)
	}
	if len(h.Orders()) != 0 {
		t.Fatalf("accepted %v", h.Orders())
	}
}

// The signature check can fail: with another secret, every delivery is
// refused with 401 and dead-lettered.
func TestWrongSecretIsRefused(t *testing.T) {
	t.Parallel()
	srv, b, h := start(t, "whsec_c2VjcmV0LWJlbG9uZ2luZy10by1zb21lb25lLWVsc2U=")
	srv.Publish(t, order("e", 100))
	if dl := b.WaitDeadLetters(t, 1); dl[0].Status != http.StatusUnauthorized {
		t.Fatalf("dead letter status %d, want 401", dl[0].Status)
	}
	if len(h.Orders()) != 0 {
		t.Fatalf("accepted %v with the wrong secret", h.Orders())
	}
}
