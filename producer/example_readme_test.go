package producer_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/embedded"
	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
)

// The Go program of docs/testing.md#publishing-events, run against an
// embedded JetStream.
func Example_readme() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "jetbridge-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(ctx, embedded.Options{Listen: "127.0.0.1:0", StoreDir: dir})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	if err := createEvents(ctx, srv.ClientURL()); err != nil {
		fmt.Println(err)
		return
	}
	readmeMain(srv.ClientURL())
	// Output:
	// stream=EVENTS seq=1 duplicate=false
}

// createEvents creates the stream the bridge would provision.
func createEvents(ctx context.Context, url string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
	return err
}

// readmeMain is main of the program in
// docs/testing.md#publishing-events with url for nats.DefaultURL;
// test/readme_test.go checks that the lines between the markers are the
// page's, line for line.
func readmeMain(url string) {
	// README begin
	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := producer.NewPublisher(js, "events").Publish(ctx, producer.Event{
		ID:       "fall-17",     // Nats-Msg-Id and Event-Id
		Type:     "sensor.fall", // subject events.critical.sensor.fall
		Severity: subjects.Critical,
		Payload:  []byte(`{"value":1}`),
		Metadata: map[string]string{"device": "bed-3"}, // Event-Meta-device
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("stream=%s seq=%d duplicate=%t\n", res.Stream, res.Seq, res.Duplicate)
	// README end
}
