package jetbridgetest_test

import (
	"fmt"
	"testing"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/jetbridgetest"
	"github.com/sotercare/jetbridge/producer"
)

// What a user's test pays for the kit
// (docs/testing.md#testing-your-producer-and-receiver), each iteration one test's worth, cleanup included: starting
// a server, a receiver and a bridge; and that plus publishing 100 events
// and waiting until all are delivered. Each iteration runs in its own
// scope (exampleT), so its cleanups run before the next one starts.
//
//	go test -run '^$' -bench . -benchtime 20x ./jetbridgetest
func BenchmarkStart(b *testing.B) {
	for b.Loop() {
		t := newExampleT()
		startKit(t)
		t.finish()
	}
}

func BenchmarkHundredEvents(b *testing.B) {
	for b.Loop() {
		t := newExampleT()
		srv, rec, br := startKit(t)
		for i := range 100 {
			srv.Publish(t, producer.Event{ID: fmt.Sprintf("e-%03d", i), Type: "t", Payload: []byte(`{}`)})
		}
		rec.WaitCount(t, 100)
		br.WaitSettled(t, 100, bridge.OutcomeDelivered)
		t.finish()
	}
}

func startKit(t testing.TB) (*jetbridgetest.Server, *jetbridgetest.Receiver, *jetbridgetest.Bridge) {
	srv := jetbridgetest.NewServer(t)
	rec := jetbridgetest.NewReceiver(t)
	return srv, rec, jetbridgetest.StartBridge(t, srv, routeYAML(rec.URL(), ""))
}
