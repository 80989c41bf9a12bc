package deadletter

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"time"
)

// The Nats-Msg-Id values of dead letters and of their replays. JetStream
// stores one message per id inside a stream's duplicate window, so each
// id names what must be stored at most once.

// MsgID is the Nats-Msg-Id of the dead letter of one delivery: message
// seq of stream on route. A retried dead-lettering of the same delivery
// stores one copy, while two routes dead-lettering the same event store
// two.
func MsgID(route, stream string, seq uint64) string {
	return "dlq:" + route + ":" + stream + ":" + strconv.FormatUint(seq, 10)
}

// RestoreMsgID is the Nats-Msg-Id a dead letter is stored again under
// when the dead-letter stream answered its first publish (under id, its
// MsgID) as a duplicate of another message, planted at sequence planted
// and stored at plantedAt: id, ":", and 22 base64url characters (the
// first 128 bits) of the SHA-256 of id, the planted message's sequence
// and stored time (to the nanosecond) and the SHA-256 of the payload
// data. A producer cannot plant it in advance (it cannot read the planted
// message's stored time), and a retried dead-lettering of the same
// delivery computes the same id, so it still stores one copy.
func RestoreMsgID(id string, planted uint64, plantedAt time.Time, data []byte) string {
	payload := sha256.Sum256(data)
	h := sha256.New()
	fmt.Fprintf(h, "jetbridge dead letter v1\x00%s\x00%d\x00%d\x00", id, planted, plantedAt.UnixNano())
	h.Write(payload[:])
	return id + ":" + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:16])
}

// replayIDDomain starts what ReplayMsgID digests, so that no other digest
// of the same fields is ever the same id.
const replayIDDomain = "jetbridge replay v1"

// ReplayMsgID is the Nats-Msg-Id of the replay of dead letter d: "replay:"
// and 22 base64url characters (the first 128 bits) of the SHA-256 of the
// dead-letter stream's name, d's sequence there, the time that stream
// stored d (to the nanosecond) and the SHA-256 of d's payload. Two replays
// of one dead letter inside the source stream's duplicate window store one
// event. A producer cannot compute it: the stored time is known only to
// readers of the dead-letter stream, and the payload is bound in too, so it
// cannot make a replay a "duplicate" of a message of its own. d must come
// from Get (or List withData).
func ReplayMsgID(d Message) string {
	payload := sha256.Sum256(d.Data)
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%d\x00%d\x00", replayIDDomain, d.Stream, d.Seq, d.Stored.UnixNano())
	h.Write(payload[:])
	return "replay:" + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:16])
}
