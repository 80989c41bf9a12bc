package bridge

import (
	"testing"

	"github.com/sotercare/jetbridge/idempotency"
)

// Naming the replica in a record costs the hot path no allocation: the
// value is built by the same single concatenation, with or without it.
// (The control: the same measure sees the allocations that encoding does
// make, so it is not blind.)
func TestHolderEncodeReplicaAllocs(t *testing.T) {
	h := holderOf(&event{Stream: "EVENTS", Seq: 12, Delivered: 1, Subject: "events.info.order.created", Payload: []byte(`{"order":42}`)})
	h.state = stateInFlight
	without := testing.AllocsPerRun(200, func() { _ = h.encode() })
	h.replica = idempotency.Replica(4242, "ops-1.example")
	with := testing.AllocsPerRun(200, func() { _ = h.encode() })
	if with != without {
		t.Fatalf("encode allocates %v times with the replica, %v without", with, without)
	}
	if without == 0 {
		t.Fatalf("encode measured at 0 allocations: the measure cannot see a difference")
	}
}
