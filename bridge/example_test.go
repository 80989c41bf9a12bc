package bridge_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/embedded"
)

// A bridge from a configuration: New builds it, Run provisions the stream
// and the route's consumer, then delivers each published event to the
// destination and settles it, until its context ends.
func Example() {
	// A JetStream server and an HTTP destination, both on loopback.
	dir, err := os.MkdirTemp("", "bridge-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(context.Background(), embedded.Options{StoreDir: dir})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	dest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	defer dest.Close()

	cfg, err := config.Load([]byte(fmt.Sprintf(`
destinations:
  orders: {url: %s}
routes:
  - {name: orders, subjects: ["events.>"], destination: orders}
`, dest.URL)), "example.yaml")
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}

	settled := make(chan bridge.Settled, 1)
	b, err := bridge.New(cfg, js, bridge.Options{
		OnSettle: func(s bridge.Settled) { settled <- s },
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	<-b.Ready() // the stream and the consumer exist

	if _, err := js.Publish(ctx, "events.info.order.created", []byte(`{"order":42}`), jetstream.WithMsgID("order-42")); err != nil {
		log.Fatal(err)
	}
	s := <-settled
	fmt.Println(s.Route, s.EventID, s.Outcome, s.Tries)

	stop() // Run drains and returns
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output: orders order-42 delivered 1
}
