package producer_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/embedded"
	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
)

// Publishing the same event id twice inside the stream's duplicate window
// stores it once: the second publish reports the original's sequence.
func ExamplePublisher_Publish() {
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
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "EVENTS", Subjects: []string{"events.>"}, Duplicates: 2 * time.Minute,
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	p := producer.NewPublisher(js, "events")
	ev := producer.Event{
		ID:       "fall-42",
		Type:     "sensor.fall",
		Severity: subjects.Critical,
		Payload:  []byte(`{"resident":"r-7"}`),
	}
	for range 2 {
		res, err := p.Publish(ctx, ev)
		if err != nil {
			fmt.Println(err)
			return
		}
		word := "stored"
		if res.Duplicate {
			word = "duplicate"
		}
		fmt.Printf("%s %s seq=%d\n", word, res.Subject, res.Seq)
	}
	// Output:
	// stored events.critical.sensor.fall seq=1
	// duplicate events.critical.sensor.fall seq=1
}

// Message shows what Publish sends, without a connection.
func ExamplePublisher_Message() {
	p := producer.NewPublisher(nil, "events")
	msg, err := p.Message(producer.Event{
		ID:       "fall-42",
		Type:     "sensor.fall",
		Severity: subjects.Critical,
		Metadata: map[string]string{"room": "12"},
		Payload:  []byte(`{"resident":"r-7"}`),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(msg.Subject)
	for _, k := range slices.Sorted(maps.Keys(msg.Header)) {
		fmt.Printf("%s: %s\n", k, msg.Header[k][0])
	}
	fmt.Printf("%s\n", msg.Data)
	// Output:
	// events.critical.sensor.fall
	// Content-Type: application/json
	// Event-Id: fall-42
	// Event-Meta-room: 12
	// Event-Severity: CRITICAL
	// Event-Type: sensor.fall
	// Nats-Msg-Id: fall-42
	// {"resident":"r-7"}
}
