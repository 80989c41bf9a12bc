// Package idempotency is the operator's side of the bridge's idempotency
// records: it reads one event's record and removes it ("bridge idem show"
// and "bridge idem forget", docs/operating.md#idempotency-records).
//
// On a route with idempotency: true the bridge (package bridge) keeps one
// record per event id in the JetStream key-value bucket
// idempotency.bucket, under Key(route, event id). The record is created,
// in flight, before the first HTTP try; it becomes done after a 2xx, and is
// deleted when the delivery fails, so a failed delivery never consumes the
// event id. A later message with the same id and the same subject and
// payload is a duplicate (acked, nothing sent); with another subject or
// payload it is dead-lettered with reason event-id-conflict, and stays so
// while the record stands: Forget removes it, after which a replay of the
// dead letter delivers it.
//
// The value of a record is four fields separated by spaces (Value and
// ParseValue), readable by every release since 0.1.0:
//
//	done EVENTS.4242.ops-1/<sha256 hex of the payload>/<subject> 12 1
//
// state, then the stream with the replica that wrote it (process id and
// host name, after the first "."), the payload digest and the subject,
// then the stream sequence and the delivery count. A record of 0.1.0 has
// no replica ("EVENTS/<digest>/<subject>"), one of an earlier build no
// content either ("EVENTS"); both read, with the missing parts empty.
//
// Invariants: this package never writes a record, only deletes one at
// the revision it read (Forget), so it cannot race a delivery into a
// wrong state; every value read is untrusted and bounded: an unreadable
// one is an error that never quotes it.
package idempotency
