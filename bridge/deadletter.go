package bridge

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/subjects"
)

// Dead-letter headers (CONTRACT 4.3).
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
// once JetStream acknowledged it (or failed to).
func (r *route) deadLetter(ctx context.Context, orig nats.Header, data []byte, ev *event, reason string, failure error) error {
	h := make(nats.Header, len(orig)+12)
	for k, vs := range orig {
		// No Nats-* header is copied: the original Nats-Msg-Id would make the
		// dead letter of a second route a "duplicate", and expectations,
		// rollups, TTLs and batches do not apply to a copy.
		if strings.HasPrefix(k, "Nats-") || strings.HasPrefix(k, "Bridge-") {
			continue
		}
		h[k] = append([]string(nil), vs...)
	}
	h.Set(HeaderEventID, ev.ID)
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
	_, err := r.b.js.PublishMsg(ctx, &nats.Msg{
		Subject: subjects.DeadLetter(dl.SubjectPrefix, r.cfg.Name, ev.Subject),
		Header:  h,
		Data:    data,
	}, jetstream.WithExpectStream(dl.Stream))
	return err
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
