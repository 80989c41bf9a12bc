package orders_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"example.com/producer-test/orders"
	"github.com/sotercare/jetbridge/jetbridgetest"
)

// bridgeConfig routes every order event to the billing receiver at url.
func bridgeConfig(url string) string {
	return fmt.Sprintf(`
destinations:
  billing: {url: %s/billing}
routes:
  - {name: billing, subjects: ["events.*.order.>"], destination: billing}
`, url)
}

func TestPlaceOrderReachesBilling(t *testing.T) {
	t.Parallel()
	srv := jetbridgetest.NewServer(t)       // JetStream on 127.0.0.1, stopped by t.Cleanup
	billing := jetbridgetest.NewReceiver(t) // records every request
	jetbridgetest.StartBridge(t, srv, bridgeConfig(billing.URL()))

	svc := orders.New(srv.JetStream()) // the producer under test
	if err := svc.PlaceOrder(t.Context(), orders.Order{ID: "42", Customer: "ada", Cents: 1999}); err != nil {
		t.Fatal(err)
	}

	got := billing.WaitEvent(t, "order-42") // fails the test listing what arrived
	var env struct {
		EventType string            `json:"eventType"`
		Metadata  map[string]string `json:"metadata"`
		Payload   orders.Order      `json:"payload"`
	}
	if err := json.Unmarshal(got.Body, &env); err != nil {
		t.Fatal(err)
	}
	if env.EventType != "order.created" || env.Payload.Cents != 1999 || env.Metadata["customer"] != "ada" {
		t.Errorf("billing got %+v", env)
	}
}

// A retried PlaceOrder (the client did not see the first answer) is
// stored once: the order id is the event id, and JetStream refuses the
// duplicate.
func TestPlaceOrderTwiceIsStoredOnce(t *testing.T) {
	t.Parallel()
	srv := jetbridgetest.NewServer(t)
	jetbridgetest.Provision(t, srv, bridgeConfig("http://127.0.0.1:1")) // the streams only, no delivery
	svc := orders.New(srv.JetStream())
	for range 2 {
		if err := svc.PlaceOrder(t.Context(), orders.Order{ID: "7", Cents: 100}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(srv.Messages(t, "EVENTS")); n != 1 {
		t.Fatalf("the stream holds %d events, want 1", n)
	}
}

// The service keeps working across a JetStream restart: its connection
// reconnects, and what was stored before is still there.
func TestPlaceOrderAfterRestart(t *testing.T) {
	t.Parallel()
	srv := jetbridgetest.NewServer(t)
	billing := jetbridgetest.NewReceiver(t)
	b := jetbridgetest.StartBridge(t, srv, bridgeConfig(billing.URL()))
	svc := orders.New(srv.JetStream())
	if err := svc.PlaceOrder(t.Context(), orders.Order{ID: "1", Cents: 100}); err != nil {
		t.Fatal(err)
	}
	b.WaitEvent(t, "order-1")

	srv.Restart(t)
	if err := svc.PlaceOrder(t.Context(), orders.Order{ID: "2", Cents: 200}); err != nil {
		t.Fatal(err)
	}
	billing.WaitEvent(t, "order-2")
	if n := len(billing.Events("order-1")); n != 1 {
		t.Errorf("order-1 billed %d times, want once", n)
	}
}
