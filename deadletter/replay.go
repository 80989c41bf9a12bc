package deadletter

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
)

// ReplayResult is what one replay did.
type ReplayResult struct {
	Seq       uint64 // the dead letter's sequence on the dead-letter stream
	EventID   string
	Subject   string // the original subject it was republished to
	Stream    string // the stream that stored (or refused) the republished event
	StreamSeq uint64 // its sequence there (the stored original's for a duplicate)
	// Duplicate means JetStream refused the republished event as a
	// duplicate of an earlier replay of the same dead letter inside the
	// stream's duplicate window: nothing new was stored. The message
	// stored at StreamSeq was read back and is this dead letter's replay
	// (else Replay returns a *ReplayCollisionError).
	Duplicate bool
	Kept      bool // the dead letter was left on the dead-letter stream
}

// Replay republishes dead letter seq to its original subject (see
// docs/operating.md#dead-letters and docs/security.md), waits for the PubAck of
// the configured stream and only then deletes the dead letter, unless
// keep.
//
// The republished event carries the original headers minus every Bridge-*
// and Nats-* header, with Event-Id unchanged, Nats-Msg-Id ReplayMsgID(d)
// (bound to the dead letter; no producer can compute it) and
// Bridge-Replayed-From "<seq>". Replaying the same dead letter again inside
// the source stream's duplicate window therefore stores nothing new
// (Duplicate is set), which makes a replay that was killed between the
// acknowledgement and the delete safe to run again.
//
// A duplicate PubAck is never taken on trust: the message stored at the
// acknowledged sequence is read back, and only when it is this dead
// letter's replay (same subject, Nats-Msg-Id, Event-Id, Bridge-Replayed-From
// and payload) does the replay count and the dead letter go. Otherwise
// Replay returns a *ReplayCollisionError (matching ErrReplayCollision),
// publishes nothing more and keeps the dead letter.
//
// Every dead letter passes the replay guard first (see CheckReplay): a
// refused one is an error matching ErrReplayRefused, nothing is published
// and the dead letter is kept. A dead letter missing a header that replay
// needs is an error matching ErrNotReplayable; one already gone matches
// ErrNotFound.
func (q *Queue) Replay(ctx context.Context, seq uint64, keep bool) (ReplayResult, error) {
	d, err := q.Get(ctx, seq)
	if err != nil {
		return ReplayResult{}, err
	}
	res, err := q.republish(ctx, d)
	if err != nil || keep {
		res.Kept = err == nil
		return res, err
	}
	if err := q.Delete(ctx, seq); err != nil && !errors.Is(err, ErrNotFound) {
		// Republished but still on the DLQ: a new replay of it is a
		// duplicate, so running again finishes the job.
		return res, fmt.Errorf("deadletter: dead letter %d republished as %s seq %d but not deleted: %w", seq, res.Stream, res.StreamSeq, err)
	}
	return res, nil
}

// CheckReplay reports whether Replay would republish d, without
// publishing anything: nil, or the refusal (matching ErrReplayRefused) or
// missing header (matching ErrNotReplayable) that stops it. It reads only
// d's headers, so d may come from List without data. A dead letter that
// passes can still be refused by JetStream when the PubAck would come
// from another stream than the configured one.
func (q *Queue) CheckReplay(d Message) error {
	_, err := q.replayMsg(d)
	return err
}

// replayMsg is the only way from a dead letter to a republished message:
// the guard, then the header-derived construction.
func (q *Queue) replayMsg(d Message) (*nats.Msg, error) {
	if err := q.guard.check(d); err != nil {
		return nil, err
	}
	return d.replayMsg(ReplayMsgID(d))
}

// jsErrStreamNotMatch is JetStream's "expected stream does not match":
// the subject is stored by another stream than the one expected.
const jsErrStreamNotMatch jetstream.ErrorCode = 10060

// republish is the first half of Replay: guard, publish and wait for the
// PubAck of the configured stream.
func (q *Queue) republish(ctx context.Context, d Message) (ReplayResult, error) {
	msg, err := q.replayMsg(d)
	if err != nil {
		return ReplayResult{Seq: d.Seq, EventID: d.EventID, Subject: d.Subject}, err
	}
	return q.publish(ctx, d, msg)
}

// publish stores msg, the replay of d, expecting the configured stream to
// store it, and takes a duplicate PubAck only when the message it names
// is this replay.
func (q *Queue) publish(ctx context.Context, d Message, msg *nats.Msg) (ReplayResult, error) {
	res := ReplayResult{Seq: d.Seq, EventID: d.EventID, Subject: msg.Subject}
	ack, err := q.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(q.source))
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrStreamNotMatch:
		return res, &ReplayRefusedError{Seq: d.Seq, Subject: d.Subject, Err: err,
			Reason: fmt.Sprintf("%s is stored by another stream than %s; nothing was stored", HeaderOriginalSubject, q.source)}
	case err != nil:
		if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
			err = producer.ErrNoStream
		}
		return res, fmt.Errorf("deadletter: replay dead letter %d: %w", d.Seq, err)
	}
	res.Stream, res.StreamSeq, res.Duplicate = ack.Stream, ack.Sequence, ack.Duplicate
	if ack.Stream != q.source {
		// JetStream honours the expectation; never count another stream's
		// acknowledgement as a replay all the same.
		return res, &ReplayRefusedError{Seq: d.Seq, Subject: d.Subject,
			Reason: fmt.Sprintf("acknowledged by stream %s, not %s; the dead letter is kept", ack.Stream, q.source)}
	}
	if ack.Duplicate {
		// Nothing was stored: something else holds this id. It counts only
		// when it is this replay (an earlier run of it).
		mismatch, err := q.storedReplay(ctx, msg, ack)
		if err != nil {
			return res, fmt.Errorf("deadletter: replay dead letter %d: duplicate of %s seq %d, which could not be read back (the dead letter is kept): %w",
				d.Seq, ack.Stream, ack.Sequence, err)
		}
		if mismatch != "" {
			return res, &ReplayCollisionError{Seq: d.Seq, Stream: ack.Stream, StreamSeq: ack.Sequence, Mismatch: mismatch}
		}
	}
	return res, nil
}

// ReplayCollisionError is a replay that JetStream answered as a duplicate
// of a message that, read back, is not this dead letter's replay: someone
// stored another message under the replay's Nats-Msg-Id. Nothing was
// stored and the dead letter is kept. It matches ErrReplayCollision.
type ReplayCollisionError struct {
	Seq       uint64 // the dead letter's sequence on the dead-letter stream
	Stream    string // the stream that answered
	StreamSeq uint64 // the sequence of the message it holds under the id
	// Mismatch names what differs (a header name or "payload"), never a
	// value.
	Mismatch string
}

func (e *ReplayCollisionError) Error() string {
	return fmt.Sprintf("deadletter: dead letter %d kept: replay collision: %s seq %d holds another message under this replay's Nats-Msg-Id (%s); nothing was stored",
		e.Seq, e.Stream, e.StreamSeq, e.Mismatch)
}

func (e *ReplayCollisionError) Is(target error) bool { return target == ErrReplayCollision }

// storedReplay reads back the message that a duplicate PubAck names and
// says what makes it another message than want (names only), or "" when
// it is want as JetStream stores it. A message that is gone is a
// mismatch: nothing proves the replay was stored.
func (q *Queue) storedReplay(ctx context.Context, want *nats.Msg, ack *jetstream.PubAck) (string, error) {
	m, err := readStored(ctx, q.js, ack.Stream, ack.Sequence)
	if err != nil {
		return "", err
	}
	if m == nil {
		return "it is gone, so it cannot be read back", nil
	}
	return replayMismatch(m.Subject, m.Header, m.Data, want), nil
}

// replayMismatch compares a stored message with the replay want: subject,
// Nats-Msg-Id, Event-Id, Bridge-Replayed-From and the payload's SHA-256.
// It returns what differs, or "".
func replayMismatch(subject string, h nats.Header, data []byte, want *nats.Msg) string {
	var diff []string
	if subject != want.Subject {
		diff = append(diff, "subject")
	}
	for _, k := range []string{jetstream.MsgIDHeader, producer.HeaderEventID, HeaderReplayedFrom} {
		if !slices.Equal(h[k], want.Header[k]) {
			diff = append(diff, k)
		}
	}
	if sha256.Sum256(data) != sha256.Sum256(want.Data) {
		diff = append(diff, "payload")
	}
	if len(diff) == 0 {
		return ""
	}
	return "different " + strings.Join(diff, ", ")
}

// replayMsg is the message built from d's headers, under Nats-Msg-Id id,
// as Replay publishes it once the replay guard let d through; an error
// (matching ErrNotReplayable) names the missing header. It applies no
// guard itself (Queue.replayMsg does). The payload is d.Data, so d must
// come from Get or List withData for a real replay.
func (d Message) replayMsg(id string) (*nats.Msg, error) {
	if d.Subject == "" {
		return nil, notReplayable(d.Seq, "no "+HeaderOriginalSubject+" header")
	}
	if subjects.ValidateSubject(d.Subject) != nil {
		return nil, notReplayable(d.Seq, HeaderOriginalSubject+" is not a valid subject")
	}
	if d.EventID == "" {
		return nil, notReplayable(d.Seq, "no "+producer.HeaderEventID+" header")
	}
	h := make(nats.Header, len(d.Header)+2)
	for k, vs := range d.Header {
		if replayDrops(k) {
			continue
		}
		h[k] = append([]string(nil), vs...)
	}
	seq := strconv.FormatUint(d.Seq, 10)
	h.Set(producer.HeaderEventID, d.EventID)
	h.Set(jetstream.MsgIDHeader, id)
	h.Set(HeaderReplayedFrom, seq)
	return &nats.Msg{Subject: d.Subject, Header: h, Data: d.Data}, nil
}

// replayDrops reports whether a dead letter's header stays behind on
// replay: the bridge's own, and every Nats-* header, in any case (the dead
// letter's broker dedup key, and expectations, rollups, TTLs, schedules or
// batches that a planted dead letter could carry).
func replayDrops(k string) bool {
	k = strings.ToLower(k)
	return strings.HasPrefix(k, "bridge-") || strings.HasPrefix(k, "nats-")
}

// readStored reads message seq of a stream (the source stream a replay
// went to); nil when it is gone.
func readStored(ctx context.Context, js jetstream.JetStream, stream string, seq uint64) (*jetstream.RawStreamMsg, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	return m, err
}
