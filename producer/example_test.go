package producer_test

import (
	"context"
	"errors"
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

// startJetStream starts an embedded JetStream with a stream EVENTS on
// events.>, for the examples; stop stops it.
func startJetStream(ctx context.Context) (js jetstream.JetStream, stop func(), err error) {
	dir, err := os.MkdirTemp("", "jetbridge-example-")
	if err != nil {
		return nil, nil, err
	}
	srv, err := embedded.Start(ctx, embedded.Options{Listen: "127.0.0.1:0", StoreDir: dir})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	stop = func() { srv.Shutdown(); os.RemoveAll(dir) }
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		stop()
		return nil, nil, err
	}
	stop = func() { nc.Close(); srv.Shutdown(); os.RemoveAll(dir) }
	if js, err = jetstream.New(nc); err == nil {
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
	}
	if err != nil {
		stop()
		return nil, nil, err
	}
	return js, stop, nil
}

// The subject of an event is <root>.<severity>.<type>, the root "events"
// unless NewPublisher is given another; an event with a Subject of its own
// keeps it, and its type and severity are read from it.
func ExampleNewPublisher() {
	for _, c := range []struct {
		root string
		ev   producer.Event
	}{
		{"", producer.Event{Type: "order.created"}},
		{"shop", producer.Event{Type: "order.created", Severity: subjects.Warning}},
		{"", producer.Event{Subject: "events.critical.sensor.fall"}},
	} {
		msg, err := producer.NewPublisher(nil, c.root).Message(c.ev)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(msg.Subject, msg.Header.Get(producer.HeaderEventType), msg.Header.Get(producer.HeaderEventSeverity))
	}
	// Output:
	// events.info.order.created order.created INFO
	// shop.warning.order.created order.created WARNING
	// events.critical.sensor.fall sensor.fall CRITICAL
}

// An event that is not valid is refused before anything is sent.
func ExamplePublisher_Message_invalid() {
	p := producer.NewPublisher(nil, "events")
	for _, ev := range []producer.Event{
		{},
		{Type: "order.created", Severity: "LOUD"},
		{Type: "order.created", Metadata: map[string]string{"bad key": "x"}},
		{Type: "order.created", ID: "line\nbreak"},
	} {
		_, err := p.Message(ev)
		fmt.Println(err)
	}
	// Output:
	// producer: an event needs a type or a subject
	// invalid subject: severity "LOUD" is not one of info, warning, critical
	// producer: metadata key "bad key" is not a valid header name
	// producer: event id contains a control character
}

// A hook adds headers taken from the publish's context; it can never
// replace the event's own headers.
func ExampleWithHeaders() {
	type tenantKey struct{}
	ctx := context.Background()
	js, stop, err := startJetStream(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()

	p := producer.NewPublisher(js, "events", producer.WithHeaders(func(ctx context.Context, h nats.Header) {
		if t, ok := ctx.Value(tenantKey{}).(string); ok {
			h.Set("Tenant", t)
		}
		h.Set(producer.HeaderEventID, "not-this-one") // ignored: the event sets it
	}))
	res, err := p.Publish(context.WithValue(ctx, tenantKey{}, "acme"), producer.Event{ID: "order-1", Type: "order.created"})
	if err != nil {
		fmt.Println(err)
		return
	}
	stream, err := js.Stream(ctx, res.Stream)
	if err != nil {
		fmt.Println(err)
		return
	}
	stored, err := stream.GetMsg(ctx, res.Seq)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("Tenant:", stored.Header.Get("Tenant"))
	fmt.Println("Event-Id:", stored.Header.Get(producer.HeaderEventID))
	// Output:
	// Tenant: acme
	// Event-Id: order-1
}

// A subject that no stream captures is ErrNoStream: nothing was stored.
func ExamplePublisher_Publish_noStream() {
	ctx := context.Background()
	js, stop, err := startJetStream(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()

	p := producer.NewPublisher(js, "audit") // the stream captures events.> only
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = p.Publish(ctx, producer.Event{ID: "a-1", Type: "login"})
	fmt.Println(errors.Is(err, producer.ErrNoStream))
	fmt.Println(err)
	// Output:
	// true
	// producer: publish audit.info.login: no stream captures the subject
}

// Header values may hold no control character but tab.
func ExampleValidHeaderValue() {
	for _, v := range []string{"bed 12", "a\tb", "a\r\nX-Injected: 1"} {
		fmt.Printf("%q %t\n", v, producer.ValidHeaderValue(v))
	}
	// Output:
	// "bed 12" true
	// "a\tb" true
	// "a\r\nX-Injected: 1" false
}
