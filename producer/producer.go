// Package producer publishes events the way jetbridge expects them: under
// the subject scheme of package subjects, with Nats-Msg-Id (so JetStream
// refuses a duplicate inside the stream's duplicate window), Event-Id,
// Event-Type, Event-Severity, Content-Type and Event-Meta-* headers
// (docs/testing.md#publishing-events), waiting for each PubAck. Its invariant: a Publish
// that returns without error was stored by a stream (or recognised as a
// duplicate of a stored event); nothing invalid is ever sent.
//
// It depends on nats.go's jetstream package and on subjects only, so a
// producer service does not pull in the bridge's runtime.
package producer

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/sotercare/jetbridge/subjects"
)

// Headers producers set on events (docs/testing.md#publishing-events).
const (
	HeaderEventID       = "Event-Id"
	HeaderEventType     = "Event-Type"
	HeaderEventSeverity = "Event-Severity"
	HeaderMetaPrefix    = "Event-Meta-"
	HeaderContentType   = "Content-Type"
)

// ValidHeaderValue reports whether v can be sent as a NATS or HTTP header
// value: no control characters other than tab (so no CR or LF).
func ValidHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// ErrNoStream means no JetStream stream captures the subject: the event
// was not stored.
var ErrNoStream = errors.New("no stream captures the subject")

// Event is what a producer publishes.
type Event struct {
	// ID is the event id, sent as Nats-Msg-Id and Event-Id; empty means a
	// new unique id. Publishing the same ID again inside the stream's
	// duplicate window stores nothing.
	ID string
	// Type is the event type, e.g. "order.created". Without Subject, the
	// subject is <root>.<severity>.<type>.
	Type string
	// Severity defaults to the subject's severity token, else INFO.
	Severity subjects.Severity
	// Subject, when set, is used as is; Type then defaults to the type the
	// subject scheme derives from it.
	Subject string
	// Payload is the message data, JSON for the envelope format.
	Payload []byte
	// Metadata entries are sent as Event-Meta-<key> headers.
	Metadata map[string]string
	// ContentType defaults to application/json.
	ContentType string
}

// PublishResult is JetStream's answer for one event.
type PublishResult struct {
	ID        string
	Subject   string
	Stream    string
	Seq       uint64
	Duplicate bool // refused as a duplicate: Seq is the stored original's
}

// Publisher publishes events under the subject scheme and waits for each
// PubAck. It is safe for concurrent use.
type Publisher struct {
	js      jetstream.JetStream
	root    string
	headers func(ctx context.Context, h nats.Header) // see WithHeaders; nil when none
}

// Option configures a Publisher.
type Option func(*Publisher)

// WithHeaders sets a hook that Publish calls with its context and an empty
// header before sending, to add headers taken from the context, such as
// the W3C traceparent of the caller's span (tracing.Inject does that). A
// header the hook adds is sent unless the event already has it (in any
// case): the hook can never replace Nats-Msg-Id, an Event-* header or
// Content-Type. A hook that sets an invalid name or a value with a
// control character makes Publish fail before sending.
func WithHeaders(hook func(ctx context.Context, h nats.Header)) Option {
	return func(p *Publisher) { p.headers = hook }
}

// NewPublisher returns a Publisher naming subjects under root ("events"
// when empty).
func NewPublisher(js jetstream.JetStream, root string, opts ...Option) *Publisher {
	if root == "" {
		root = "events"
	}
	p := &Publisher{js: js, root: root}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Root is the subject root the Publisher names subjects under.
func (p *Publisher) Root() string { return p.root }

// addHeaders runs the header hook and adds what it set to msg (see
// WithHeaders).
func (p *Publisher) addHeaders(ctx context.Context, msg *nats.Msg) error {
	if p.headers == nil {
		return nil
	}
	extra := nats.Header{}
	p.headers(ctx, extra)
	for k, vs := range extra {
		if !validMetaKey(k) {
			return fmt.Errorf("producer: header hook set an invalid header name %q", k)
		}
		for _, v := range vs {
			if !ValidHeaderValue(v) {
				return fmt.Errorf("producer: header hook set %s with a control character", k)
			}
		}
		if hasHeader(msg.Header, k) || len(vs) == 0 {
			continue
		}
		msg.Header[k] = vs
	}
	return nil
}

func hasHeader(h nats.Header, key string) bool {
	for k := range h {
		if strings.EqualFold(k, key) {
			return true
		}
	}
	return false
}

// Message renders ev as the NATS message Publish sends, with its headers
// (docs/testing.md#publishing-events). It validates the subject, id and metadata.
func (p *Publisher) Message(ev Event) (*nats.Msg, error) {
	sev := ev.Severity
	if sev == "" {
		sev = subjects.Info
		if ev.Subject != "" {
			_, sev = subjects.Describe(ev.Subject)
		}
	}
	sev, err := subjects.ParseSeverity(string(sev))
	if err != nil {
		return nil, err
	}
	subject := ev.Subject
	if subject == "" {
		if ev.Type == "" {
			return nil, errors.New("producer: an event needs a type or a subject")
		}
		if subject, err = subjects.Name(p.root, sev, ev.Type); err != nil {
			return nil, err
		}
	} else if err := subjects.ValidateSubject(subject); err != nil {
		return nil, err
	}
	typ := ev.Type
	if typ == "" {
		typ, _ = subjects.Describe(subject)
	}
	id := ev.ID
	if id == "" {
		id = nuid.Next()
	}
	ct := ev.ContentType
	if ct == "" {
		ct = "application/json"
	}
	for name, v := range map[string]string{"id": id, "type": typ, "content type": ct} {
		if !ValidHeaderValue(v) {
			return nil, fmt.Errorf("producer: event %s contains a control character", name)
		}
	}
	h := nats.Header{}
	h.Set(jetstream.MsgIDHeader, id)
	h.Set(HeaderEventID, id)
	h.Set(HeaderEventType, typ)
	h.Set(HeaderEventSeverity, string(sev))
	h.Set(HeaderContentType, ct)
	for k, v := range ev.Metadata {
		if !validMetaKey(k) {
			return nil, fmt.Errorf("producer: metadata key %q is not a valid header name", k)
		}
		if !ValidHeaderValue(v) {
			return nil, fmt.Errorf("producer: metadata %q has a control character in its value", k)
		}
		h[HeaderMetaPrefix+k] = []string{v} // keys as published: no canonicalisation
	}
	return &nats.Msg{Subject: subject, Header: h, Data: ev.Payload}, nil
}

// Publish stores ev and returns JetStream's acknowledgement. A duplicate
// inside the duplicate window is not an error: Duplicate is set.
func (p *Publisher) Publish(ctx context.Context, ev Event) (PublishResult, error) {
	msg, err := p.Message(ev)
	if err != nil {
		return PublishResult{}, err
	}
	if err := p.addHeaders(ctx, msg); err != nil {
		return PublishResult{}, err
	}
	id := msg.Header.Get(HeaderEventID)
	ack, err := p.js.PublishMsg(ctx, msg)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
			return PublishResult{}, fmt.Errorf("producer: publish %s: %w", msg.Subject, ErrNoStream)
		}
		return PublishResult{}, fmt.Errorf("producer: publish %s: %w", msg.Subject, err)
	}
	return PublishResult{ID: id, Subject: msg.Subject, Stream: ack.Stream, Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// validMetaKey accepts an HTTP token (RFC 9110): what a header name may be.
func validMetaKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
