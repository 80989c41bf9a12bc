package bridge

import (
	"context"
	"errors"
	"fmt"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
	"github.com/sotercare/jetbridge/tracing"
)

// Dead-letter headers; see the README's dead-letter section.
const (
	HeaderReason           = "Bridge-Reason"
	HeaderFailure          = "Bridge-Failure"
	HeaderStatus           = "Bridge-Status"
	HeaderError            = "Bridge-Error"
	HeaderRoute            = "Bridge-Route"
	HeaderDestination      = "Bridge-Destination"
	HeaderDeliveries       = "Bridge-Deliveries"
	HeaderOriginalSubject  = "Bridge-Original-Subject"
	HeaderOriginalStream   = "Bridge-Original-Stream"
	HeaderOriginalSequence = "Bridge-Original-Sequence"
	HeaderFailedAt         = "Bridge-Failed-At"
	HeaderReplayedFrom     = "Bridge-Replayed-From"
	// HeaderPayloadOmitted marks a dead letter stored without its payload
	// because the payload and headers together would exceed the server's
	// max_payload; its value is the original payload size in bytes.
	HeaderPayloadOmitted = "Bridge-Payload-Omitted"
)

// DeadLetterMsgID is the Nats-Msg-Id of a dead letter: a retried
// dead-lettering of the same delivery stores one copy, while two routes
// dead-lettering the same event store two.
func DeadLetterMsgID(route, stream string, seq uint64) string {
	return "dlq:" + route + ":" + stream + ":" + strconv.FormatUint(seq, 10)
}

// deadLetter stores the message on the dead-letter stream and returns only
// once JetStream acknowledged it (or failed to), with its sequence on the
// dead-letter stream. A dead letter that does not fit is stored in a
// reduced form (see storeDeadLetter); one that is refused even in its
// smallest form returns an error matching ErrDeadLetterRefused, and the
// caller must not settle the message as dead-lettered.
func (r *route) deadLetter(ctx context.Context, orig nats.Header, data []byte, ev *event, reason string, failure error) (uint64, error) {
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
	h.Set(jetstream.MsgIDHeader, DeadLetterMsgID(r.cfg.Name, ev.Stream, ev.Seq))
	h.Set(HeaderReason, reason)
	if kind := FailureKind(failure); kind != "" {
		h.Set(HeaderFailure, kind)
	}
	if st := statusOf(failure); st != 0 {
		h.Set(HeaderStatus, strconv.Itoa(st))
	}
	h.Set(HeaderError, describe(failure))
	h.Set(HeaderRoute, r.cfg.Name)
	h.Set(HeaderDestination, r.dest.name)
	h.Set(HeaderDeliveries, strconv.FormatUint(ev.Delivered, 10))
	h.Set(HeaderOriginalSubject, ev.Subject)
	h.Set(HeaderOriginalStream, ev.Stream)
	h.Set(HeaderOriginalSequence, strconv.FormatUint(ev.Seq, 10))
	h.Set(HeaderFailedAt, time.Now().UTC().Format(time.RFC3339))

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
	form, err := storeDeadLetter(ctx, r.b.js, full, limit, r.b.parts.shrinkDeadLetter)
	if err != nil {
		return 0, err
	}
	if form.stored && form.form > dlFull {
		r.b.m.payloadOmitted.WithLabelValues(r.cfg.Name).Inc()
		msgLog(r.log.Warn(), ev).Int("payload_bytes", len(data)).
			Int64("max_payload", limit).Str("refused_by", form.refusedBy).
			Bool("headers_omitted", form.form == dlMinimal).Str("reason", reason).
			Msg("dead letter too large: stored without its payload; the payload stays in the source stream at Bridge-Original-Sequence")
	}
	return form.seq, nil
}

// HeaderHeadersOmitted marks a dead letter that, even without its payload,
// would not fit: the original headers were dropped too, except Event-Id,
// Event-Type, Event-Severity and Content-Type. Its value is the number of
// original header fields dropped.
const HeaderHeadersOmitted = "Bridge-Headers-Omitted"

// dlForm is how much of the original message a dead letter keeps.
type dlForm int

const (
	dlFull      dlForm = iota // payload and headers
	dlNoPayload               // headers, no payload (Bridge-Payload-Omitted)
	dlMinimal                 // no payload, only the kept original headers (Bridge-Headers-Omitted)
)

// keptHeaders are the original headers a minimal dead letter keeps.
var keptHeaders = []string{producer.HeaderEventID, producer.HeaderEventType, producer.HeaderEventSeverity, producer.HeaderContentType,
	tracing.HeaderTraceparent, tracing.HeaderTracestate} // the original trace (README "Tracing")

// shrinkDeadLetter returns a copy of the full dead letter in form to
// (dlNoPayload or dlMinimal); see parts.
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
	h.Set(HeaderPayloadOmitted, strconv.Itoa(len(full.Data)))
	if to == dlMinimal {
		h.Set(HeaderHeadersOmitted, strconv.Itoa(dropped))
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
}

// storeDeadLetter publishes the dead letter in the largest form that fits:
// full when it fits max_payload (limit; 0 when unknown) and JetStream's
// 64 KiB header limit, else without its payload, else without the original
// headers too. The size is computed first (the client would refuse without
// sending); a refusal for size or format by the client or the stream
// (which may have its own max_msg_size) moves on to the next form. Every form carries the same
// Nats-Msg-Id, so a retry stores one copy.
func storeDeadLetter(ctx context.Context, js jetstream.JetStream, full *nats.Msg, limit int64,
	shrink func(*nats.Msg, dlForm) *nats.Msg) (dlStored, error) {
	out := dlStored{form: dlFull}
	m := full
	for out.form < dlMinimal {
		why, ok := fits(m, limit)
		if ok {
			break
		}
		out.form++
		out.refusedBy = why
		m = shrink(full, out.form)
	}
	for {
		ack, err := js.PublishMsg(ctx, m)
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
		m = shrink(full, out.form)
	}
}

// describe is the Bridge-Error text: the typed failure's own message, which
// never includes a URL, payload, header value or response body.
func describe(err error) string {
	var de *DeliveryError
	if errors.As(err, &de) {
		err = de.Err
	}
	if err == nil {
		return ""
	}
	return err.Error()
}
