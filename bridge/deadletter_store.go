package bridge

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
	"github.com/sotercare/jetbridge/tracing"
)

// deadLetter stores the message on the dead-letter stream and returns only
// once JetStream acknowledged it (or failed to), with its sequence on the
// dead-letter stream. A dead letter that does not fit is stored in a
// reduced form (see storeDeadLetter); one that is refused even in its
// smallest form returns an error matching ErrDeadLetterRefused, and the
// caller must not settle the message as dead-lettered.
func (r *route) deadLetter(ctx context.Context, orig nats.Header, data []byte, ev *event, reason deadletter.Reason, failure error) (uint64, error) {
	h := make(nats.Header, len(orig)+14)
	for k, vs := range orig {
		// No Nats-* header is copied: the original Nats-Msg-Id would make the
		// dead letter of a second route a "duplicate", and expectations,
		// rollups, TTLs and batches do not apply to a copy.
		if strings.HasPrefix(k, "Nats-") || strings.HasPrefix(k, "Bridge-") {
			continue
		}
		h[k] = append([]string(nil), vs...)
	}
	h.Set(producer.HeaderEventID, ev.ID)
	h.Set(jetstream.MsgIDHeader, deadletter.MsgID(r.cfg.Name, ev.Stream, ev.Seq))
	h.Set(deadletter.HeaderReason, string(reason))
	if kind := FailureKind(failure); kind != "" {
		h.Set(deadletter.HeaderFailure, string(kind))
	}
	if st := statusOf(failure); st != 0 {
		h.Set(deadletter.HeaderStatus, strconv.Itoa(st))
	}
	h.Set(deadletter.HeaderError, describe(failure))
	h.Set(deadletter.HeaderRoute, r.cfg.Name)
	h.Set(deadletter.HeaderDestination, r.dest.name)
	h.Set(deadletter.HeaderDeliveries, strconv.FormatUint(ev.Delivered, 10))
	h.Set(deadletter.HeaderOriginalSubject, ev.Subject)
	h.Set(deadletter.HeaderOriginalStream, ev.Stream)
	h.Set(deadletter.HeaderOriginalSequence, strconv.FormatUint(ev.Seq, 10))
	h.Set(deadletter.HeaderFailedAt, time.Now().UTC().Format(time.RFC3339))

	dl := r.b.cfg.DeadLetter
	// Set here rather than with jetstream.WithExpectStream, so that the size
	// computed below is the size sent.
	h.Set(jetstream.ExpectedStreamHeader, dl.Stream)
	full := &nats.Msg{
		Subject: subjects.DeadLetter(dl.SubjectPrefix, r.cfg.Name, ev.Subject),
		Header:  h,
		Data:    data,
	}
	limit := r.b.js.Conn().MaxPayload()
	form, err := storeDeadLetter(ctx, r.b.js, dl.Stream, full, limit)
	if form.plantedSeq != 0 {
		// Names and sequences only: the planted message is untrusted.
		e := r.log.Warn().Str("stream", ev.Stream).Uint64("stream_seq", ev.Seq).
			Str("dlq_stream", dl.Stream).Uint64("planted_dlq_seq", form.plantedSeq).Str("mismatch", form.mismatch)
		if err == nil {
			e.Uint64("dlq_seq", form.seq).Msg("dead-letter id collision: the dead-letter stream held another message under this dead letter's Nats-Msg-Id; stored again under a new id")
		} else {
			e.Msg("dead-letter id collision: the dead-letter stream held another message under this dead letter's Nats-Msg-Id; not stored again, the message is left for redelivery")
		}
	}
	if err != nil {
		return 0, err
	}
	if form.stored && form.form > dlFull {
		r.b.m.payloadOmitted.WithLabelValues(r.cfg.Name).Inc()
		msgLog(r.log.Warn(), ev).Int("payload_bytes", len(data)).
			Int64("max_payload", limit).Str("refused_by", form.refusedBy).
			Bool("headers_omitted", form.form == dlMinimal).Str("reason", string(reason)).
			Msg("dead letter too large: stored without its payload; the payload stays in the source stream at Bridge-Original-Sequence")
	}
	return form.seq, nil
}

// dlForm is how much of the original message a dead letter keeps.
type dlForm int

const (
	dlFull      dlForm = iota // payload and headers
	dlNoPayload               // headers, no payload (Bridge-Payload-Omitted)
	dlMinimal                 // no payload, only the kept original headers (Bridge-Headers-Omitted)
)

// keptHeaders are the original headers a minimal dead letter keeps.
var keptHeaders = []string{producer.HeaderEventID, producer.HeaderEventType, producer.HeaderEventSeverity, producer.HeaderContentType,
	tracing.HeaderTraceparent, tracing.HeaderTracestate} // the original trace (docs/tracing.md)

// shrinkDeadLetter returns a copy of the full dead letter in form to
// (dlNoPayload or dlMinimal).
func shrinkDeadLetter(full *nats.Msg, to dlForm) *nats.Msg {
	if to <= dlFull {
		return full
	}
	h := make(nats.Header, len(full.Header)+2)
	dropped := 0
	for k, vs := range full.Header {
		if to == dlMinimal && !ownHeader(k) && !kept(k) {
			dropped++
			continue
		}
		h[k] = append([]string(nil), vs...)
	}
	h.Set(deadletter.HeaderPayloadOmitted, strconv.Itoa(len(full.Data)))
	if to == dlMinimal {
		h.Set(deadletter.HeaderHeadersOmitted, strconv.Itoa(dropped))
	}
	return &nats.Msg{Subject: full.Subject, Header: h}
}

// ownHeader reports whether a dead letter's header was written by the
// bridge: every original Nats-* and Bridge-* header is left out of the copy.
func ownHeader(k string) bool {
	return strings.HasPrefix(k, "Bridge-") || strings.HasPrefix(k, "Nats-")
}

func kept(k string) bool {
	for _, h := range keptHeaders {
		if strings.EqualFold(k, h) {
			return true
		}
	}
	return false
}

// maxHeaderBytes is JetStream's limit on a stored message's encoded
// headers (error code 10097 above it).
const maxHeaderBytes = 65535

// errCodeHeaderTooLarge is JetStream's "header size exceeds maximum allowed
// of 64k"; nats.go has no constant for it.
const errCodeHeaderTooLarge jetstream.ErrorCode = 10097

// msgSize is what a message counts against max_payload and a stream's
// max_msg_size: the data plus the encoded headers.
func msgSize(m *nats.Msg) int64 { return int64(len(m.Data)) + headerSize(m) }

// headerSize is the size of the encoded headers ("NATS/1.0\r\n", one
// "Key: Value\r\n" per value, "\r\n"), computed as nats.go does.
func headerSize(m *nats.Msg) int64 {
	if len(m.Header) == 0 {
		return 0
	}
	n := int64(len("NATS/1.0\r\n") + len("\r\n"))
	for k, vs := range m.Header {
		for _, v := range vs {
			n += int64(len(k) + len(textproto.TrimString(v)) + len(": \r\n"))
		}
	}
	return n
}

// fits reports whether m passes the checks known before sending: the
// server's max_payload (limit; 0 when unknown) and JetStream's header limit.
func fits(m *nats.Msg, limit int64) (string, bool) {
	switch {
	case limit > 0 && msgSize(m) > limit:
		return "max_payload", false
	case headerSize(m) > maxHeaderBytes:
		return "header_size", false
	}
	return "", true
}

// tooLarge reports whether a publish was refused for the message's size
// or format: the client's max_payload check, the stream's max_msg_size, or
// a header nats.go cannot encode.
func tooLarge(err error) (string, bool) {
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return "max_payload", true
	case errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum):
		return "stream_max_msg_size", true
	case errors.Is(err, &jetstream.APIError{ErrorCode: errCodeHeaderTooLarge}):
		return "header_size", true
	case errors.Is(err, nats.ErrBadHeaderMsg):
		return "header_format", true
	}
	return "", false
}

// dlStored says in which form a dead letter was stored.
type dlStored struct {
	form      dlForm
	stored    bool   // false: a duplicate of a copy stored before
	seq       uint64 // its sequence on the dead-letter stream (the earlier copy's for a duplicate)
	refusedBy string // why a larger form was not used: max_payload, stream_max_msg_size, header_size, header_format
	// plantedSeq is, when the first publish was answered as a duplicate of
	// a message that is not this dead letter, that message's sequence on
	// the dead-letter stream (and mismatch what differs, names only); the
	// dead letter was then stored again under deadletter.RestoreMsgID.
	plantedSeq uint64
	mismatch   string
}

// ErrDeadLetterCollision means a dead letter could not be stored because
// its Nats-Msg-Id, and the id it is stored again under, were both taken by
// other messages; the source message is left for redelivery.
var ErrDeadLetterCollision = errors.New("bridge: dead letter id taken by another message")

// dlCompared are the headers that make two dead letters the same one:
// the id, where it came from, and the form it was stored in.
var dlCompared = []string{jetstream.MsgIDHeader, producer.HeaderEventID, deadletter.HeaderRoute, deadletter.HeaderOriginalStream,
	deadletter.HeaderOriginalSequence, deadletter.HeaderOriginalSubject, deadletter.HeaderPayloadOmitted, deadletter.HeaderHeadersOmitted}

// deadLetterMismatch compares the message a duplicate PubAck names, read
// back from the dead-letter stream, with the dead letter sent: the
// subject, the headers of dlCompared, every original (not Bridge-*, not
// Nats-*) header and the payload's SHA-256 (empty, with the same
// Bridge-Payload-Omitted, for a dead letter stored without it). It
// returns what differs (names only), or "" when stored is this dead
// letter: a retried dead-lettering of the same delivery, whatever its
// reason, time or delivery count.
func deadLetterMismatch(stored *jetstream.RawStreamMsg, sent *nats.Msg) string {
	var diff []string
	if stored.Subject != sent.Subject {
		diff = append(diff, "subject")
	}
	for _, k := range dlCompared {
		if !slices.Equal(stored.Header[k], sent.Header[k]) {
			diff = append(diff, k)
		}
	}
	if !sameOriginalHeaders(stored.Header, sent.Header) {
		diff = append(diff, "original headers")
	}
	if sha256.Sum256(stored.Data) != sha256.Sum256(sent.Data) {
		diff = append(diff, "payload")
	}
	return strings.Join(diff, ", ")
}

// sameOriginalHeaders reports whether a and b hold the same original
// headers (every one but the Bridge-* and Nats-* ones and those of
// dlCompared), values in order.
func sameOriginalHeaders(a, b nats.Header) bool {
	original := func(k string) bool { return !ownHeader(k) && !slices.Contains(dlCompared, k) }
	n := 0
	for k, vs := range a {
		if !original(k) {
			continue
		}
		n++
		if !slices.Equal(vs, b[k]) {
			return false
		}
	}
	for k := range b {
		if original(k) {
			n--
		}
	}
	return n == 0
}

// withMsgID is a copy of m (headers copied) with another Nats-Msg-Id.
func withMsgID(m *nats.Msg, id string) *nats.Msg {
	h := make(nats.Header, len(m.Header))
	for k, vs := range m.Header {
		h[k] = append([]string(nil), vs...)
	}
	h.Set(jetstream.MsgIDHeader, id)
	return &nats.Msg{Subject: m.Subject, Header: h, Data: m.Data}
}

// storeDeadLetter publishes the dead letter in the largest form that fits:
// full when it fits max_payload (limit; 0 when unknown) and JetStream's
// 64 KiB header limit, else without its payload, else without the original
// headers too. The size is computed first (the client would refuse without
// sending); a refusal for size or format by the client or the stream
// (which may have its own max_msg_size) moves on to the next form. Every form carries the same
// Nats-Msg-Id, so a retry stores one copy.
//
// A duplicate PubAck is never taken on trust: the message it names is read
// back from the dead-letter stream (stream) and compared by
// deadLetterMismatch. When it is another message (planted under this
// dead letter's id), the dead letter is stored again under
// deadletter.RestoreMsgID; when that too is answered as a duplicate of
// another message, or nothing can be read back, it returns an error and
// the caller leaves the source message for redelivery: a dead letter is
// never lost to a planted id.
func storeDeadLetter(ctx context.Context, js jetstream.JetStream, stream string, full *nats.Msg, limit int64) (dlStored, error) {
	out := dlStored{form: dlFull}
	m := full
	for out.form < dlMinimal {
		why, ok := fits(m, limit)
		if ok {
			break
		}
		out.form++
		out.refusedBy = why
		m = shrinkDeadLetter(full, out.form)
	}
	for {
		ack, err := js.PublishMsg(ctx, m)
		if err == nil && ack.Duplicate {
			stored, rerr := readStored(ctx, js, stream, ack.Sequence)
			if rerr != nil {
				return out, fmt.Errorf("bridge: dead letter answered as a duplicate of %s seq %d, which could not be read back: %w", stream, ack.Sequence, rerr)
			}
			diff := "it is gone"
			if stored != nil {
				diff = deadLetterMismatch(stored, m)
			}
			if diff != "" {
				if out.plantedSeq != 0 {
					return out, fmt.Errorf("%w: %s seq %d and seq %d", ErrDeadLetterCollision, stream, out.plantedSeq, ack.Sequence)
				}
				// Planted: store it again under an id no producer can
				// plant, in the same form.
				var at time.Time
				if stored != nil {
					at = stored.Time
				}
				out.plantedSeq, out.mismatch = ack.Sequence, diff
				full = withMsgID(full, deadletter.RestoreMsgID(full.Header.Get(jetstream.MsgIDHeader), ack.Sequence, at, full.Data))
				m = shrinkDeadLetter(full, out.form)
				continue
			}
		}
		if err == nil {
			out.stored, out.seq = !ack.Duplicate, ack.Sequence
			return out, nil
		}
		why, refused := tooLarge(err)
		if !refused {
			return out, err
		}
		if out.form == dlMinimal {
			return out, fmt.Errorf("%w (%s): %w", ErrDeadLetterRefused, why, err)
		}
		out.form++
		out.refusedBy = why
		m = shrinkDeadLetter(full, out.form)
	}
}

// readStored reads message seq of a stream (the dead-letter stream); nil
// when it is gone.
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
