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
	// severityIgnored names an Event-Severity header that the subject's
	// severity token overrode: the header's severity, or severityInvalid;
	// empty when none was ignored. Never the header's value as such.
	severityIgnored string
	// payload is the request buildPayload renders of the event, allocated
	// with it (the two live exactly as long as the delivery).
	payload payload
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
	typ, fromSubject := subjects.Describe(ev.Subject)
	// Describe gives the subject itself as the type unless the subject is
	// <root>.<severity>.<type…>: the type is then a strict suffix of it.
	tokened := typ != ev.Subject
	ev.Type, ev.Severity = typ, fromSubject
	sev, ignored, invalid := severityOf(h.Get(producer.HeaderEventSeverity), fromSubject, tokened)
	if invalid == nil {
		ev.Severity, ev.severityIgnored = sev, ignored
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

// severityInvalid names, in logs, an ignored Event-Severity value that is
// not a severity: the value itself is never printed.
const severityInvalid = "invalid"

// severityOf is the bridge's Event-Severity rule (docs/security.md#what-producers-cannot-choose):
// a subject that carries a severity token (<root>.<severity>.<type…>)
// decides, whatever the header says, so that a producer allowed to publish
// on events.info.> cannot make its events CRITICAL (the request's
// X-Event-Severity and the flow-control priority); a header that disagrees
// is ignored and named in ignored. A subject without a token takes the
// header, else INFO; there a value that is not a severity makes the event
// invalid. It decides from the header's value (empty when absent) and the
// subject's severity (fromSubject, INFO when tokened is false: the subject
// has no severity token); ignored names a header it overrode (its
// severity, or severityInvalid); an error is an *InvalidEventError.
func severityOf(header string, fromSubject subjects.Severity, tokened bool) (subjects.Severity, string, error) {
	if header == "" {
		return fromSubject, "", nil
	}
	s, err := subjects.ParseSeverity(header)
	switch {
	case tokened && err != nil:
		return fromSubject, severityInvalid, nil
	case tokened && s != fromSubject:
		return fromSubject, string(s), nil
	case tokened:
		return fromSubject, "", nil
	case err != nil:
		return fromSubject, "", &InvalidEventError{Reason: "Event-Severity is not INFO, WARNING or CRITICAL"}
	}
	return s, "", nil
}

// readEvent is parseEvent for a message delivered on the route: an
// Event-Severity header the subject overrode is
// counted and logged (noteSeverityIgnored).
func (r *route) readEvent(m jetstream.Msg) (*event, error) {
	ev, err := parseEvent(m)
	if ev != nil && ev.severityIgnored != "" {
		r.noteSeverityIgnored(ev)
	}
	return ev, err
}

// severityLogEvery is how often at most a route logs an ignored
// Event-Severity header; bridge_event_severity_mismatch_total counts each.
const severityLogEvery = 10 * time.Minute

// noteSeverityIgnored counts an ignored Event-Severity header and logs it:
// the route's first one at once, then at most one line every
// severityLogEvery with the number ignored since the last line. The line
// names the two severities (the header's as INFO, WARNING, CRITICAL or
// "invalid"), never the header's value.
func (r *route) noteSeverityIgnored(ev *event) {
	n := r.b.m.children.Load().severity[r.cfg.Name]
	if n == nil { // a route the metrics were not built for: counted only
		r.b.m.severityMismatch.WithLabelValues(r.cfg.Name).Inc()
		return
	}
	n.count.Inc()
	n.log.Do("", func(_, suppressed int) {
		msgLog(r.log.Warn(), ev).
			Str("subject_severity", string(ev.Severity)).
			Str("header_severity", ev.severityIgnored).
			Int("ignored", suppressed+1).
			Str("log_every", severityLogEvery.String()).
			Msg("Event-Severity header ignored: the subject's severity token decides; every such message is counted in bridge_event_severity_mismatch_total, logged at most once per log_every per route")
	})
}
