package bridge

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
)

// event is an inbound message as the bridge understands it: the message's
// own headers are never copied into the HTTP request.
type event struct {
	ID          string
	Type        string
	Severity    subjects.Severity
	Subject     string
	Stream      string
	Seq         uint64
	Delivered   uint64
	PublishedAt time.Time
	Metadata    map[string]string
	ContentType string
	Payload     []byte
	span        trace.Span // the delivery span (trace.go); nil when tracing is off
}

// parseEvent reads a JetStream message. An unusable header gives an
// *InvalidEventError together with a usable event (for the dead letter);
// any other error means the message has no JetStream metadata.
func parseEvent(m jetstream.Msg) (*event, error) {
	md, err := m.Metadata()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoMetadata, err)
	}
	h := m.Headers()
	ev := &event{
		Subject:     m.Subject(),
		Stream:      md.Stream,
		Seq:         md.Sequence.Stream,
		Delivered:   md.NumDelivered,
		PublishedAt: md.Timestamp,
		Payload:     m.Data(),
		ContentType: "application/json",
	}
	ev.ID = eventID(h, md.Stream, md.Sequence.Stream)
	ev.Type, ev.Severity = subjects.Describe(ev.Subject)
	sev, invalid := severityOf(h, ev.Severity)
	if invalid == nil {
		ev.Severity = sev
	}
	if v := h.Get(producer.HeaderEventType); v != "" {
		ev.Type = v
	}
	if v := h.Get(producer.HeaderContentType); v != "" {
		ev.ContentType = v
	}
	for k, vs := range h {
		if key, ok := strings.CutPrefix(k, producer.HeaderMetaPrefix); ok && key != "" && len(vs) > 0 {
			if ev.Metadata == nil {
				ev.Metadata = make(map[string]string)
			}
			ev.Metadata[key] = vs[0]
		}
	}
	return ev, invalid
}

// eventID is the Event-Id header, else Nats-Msg-Id, else STREAM:SEQ.
func eventID(h nats.Header, stream string, seq uint64) string {
	if v := h.Get(producer.HeaderEventID); v != "" {
		return v
	}
	if v := h.Get(jetstream.MsgIDHeader); v != "" {
		return v
	}
	return stream + ":" + strconv.FormatUint(seq, 10)
}

// severityOf reads Event-Severity; absent means the subject's severity.
func severityOf(h nats.Header, fromSubject subjects.Severity) (subjects.Severity, error) {
	v := h.Get(producer.HeaderEventSeverity)
	if v == "" {
		return fromSubject, nil
	}
	s, err := subjects.ParseSeverity(v)
	if err != nil {
		return "", &InvalidEventError{Reason: "Event-Severity is not INFO, WARNING or CRITICAL"}
	}
	return s, nil
}
