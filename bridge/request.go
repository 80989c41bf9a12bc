package bridge

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/subjects"
)

// Headers producers set on events (CONTRACT 3).
const (
	HeaderEventID       = "Event-Id"
	HeaderEventType     = "Event-Type"
	HeaderEventSeverity = "Event-Severity"
	HeaderMetaPrefix    = "Event-Meta-"
	HeaderContentType   = "Content-Type"
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
}

// parseEvent reads a JetStream message. An unusable header gives an
// *InvalidEventError together with a usable event (for the dead letter);
// any other error means the message has no JetStream metadata.
func parseEvent(m jetstream.Msg) (*event, error) {
	md, err := m.Metadata()
	if err != nil {
		return nil, fmt.Errorf("bridge: message metadata: %w", err)
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
	if v := h.Get(HeaderEventType); v != "" {
		ev.Type = v
	}
	if v := h.Get(HeaderContentType); v != "" {
		ev.ContentType = v
	}
	for k, vs := range h {
		if key, ok := strings.CutPrefix(k, HeaderMetaPrefix); ok && key != "" && len(vs) > 0 {
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
	if v := h.Get(HeaderEventID); v != "" {
		return v
	}
	if v := h.Get(jetstream.MsgIDHeader); v != "" {
		return v
	}
	return stream + ":" + strconv.FormatUint(seq, 10)
}

// severityOf reads Event-Severity; absent means the subject's severity.
func severityOf(h nats.Header, fromSubject subjects.Severity) (subjects.Severity, error) {
	v := h.Get(HeaderEventSeverity)
	if v == "" {
		return fromSubject, nil
	}
	s, err := subjects.ParseSeverity(v)
	if err != nil {
		return "", &InvalidEventError{Reason: "Event-Severity is not INFO, WARNING or CRITICAL"}
	}
	return s, nil
}

// validHeaderValue reports whether v can be sent as an HTTP header value:
// no control characters other than tab (so no CR or LF).
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// envelope is the body of the envelope format (CONTRACT 4.1).
type envelope struct {
	ID          string            `json:"id"`
	EventType   string            `json:"eventType"`
	Severity    subjects.Severity `json:"severity"`
	Subject     string            `json:"subject"`
	Metadata    map[string]string `json:"metadata"`
	Payload     json.RawMessage   `json:"payload"`
	PublishedAt string            `json:"publishedAt"`
}

// Body formats.
const (
	FormatEnvelope    = "envelope"
	FormatRaw         = "raw"
	FormatCloudEvents = "cloudevents"
)

// payload is what one attempt sends, built once per message; each HTTP try
// turns it into a fresh *http.Request (fresh signature timestamp).
type payload struct {
	body    []byte
	headers http.Header // everything but the signature headers
	id      string
}

// buildPayload validates the event and renders the body and headers of the
// destination's format. Configured headers go first; the bridge's own
// headers override them; event metadata never becomes a header.
func buildPayload(ev *event, d *destination) (*payload, error) {
	for name, v := range map[string]string{"Event-Id": ev.ID, "Event-Type": ev.Type, "Content-Type": ev.ContentType} {
		if !validHeaderValue(v) {
			return nil, &InvalidEventError{Reason: name + " contains a control character"}
		}
	}
	h := make(http.Header, len(d.headers)+8)
	for k, v := range d.headers {
		h.Set(k, v)
	}
	var body []byte
	switch d.format {
	case FormatRaw:
		body = ev.Payload
		h.Set("Content-Type", ev.ContentType)
	case FormatCloudEvents:
		body = ev.Payload
		h.Set("Content-Type", ev.ContentType)
		h.Set("ce-specversion", "1.0")
		h.Set("ce-id", ev.ID)
		h.Set("ce-type", ev.Type)
		h.Set("ce-source", "nats://"+ev.Stream+"/"+ev.Subject)
		h.Set("ce-subject", ev.Subject)
		h.Set("ce-time", ev.PublishedAt.UTC().Format(time.RFC3339Nano))
	default: // envelope
		if !json.Valid(ev.Payload) {
			return nil, &InvalidEventError{Reason: "payload is not JSON (format envelope)"}
		}
		md := ev.Metadata
		if md == nil {
			md = map[string]string{}
		}
		var err error
		body, err = json.Marshal(envelope{
			ID: ev.ID, EventType: ev.Type, Severity: ev.Severity, Subject: ev.Subject,
			Metadata: md, Payload: ev.Payload,
			PublishedAt: ev.PublishedAt.UTC().Format(time.RFC3339Nano),
		})
		if err != nil {
			return nil, &InvalidEventError{Reason: "envelope cannot be encoded"}
		}
		h.Set("Content-Type", "application/json")
	}
	h.Set("X-Event-Id", ev.ID)
	h.Set("X-Event-Type", ev.Type)
	h.Set("X-Event-Severity", string(ev.Severity))
	h.Set("X-Delivery-Attempt", strconv.FormatUint(ev.Delivered, 10))
	h.Set("Idempotency-Key", ev.ID)
	for _, k := range []string{"Webhook-Id", "Webhook-Timestamp", "Webhook-Signature"} {
		h.Del(k) // only the bridge signs
	}
	return &payload{body: body, headers: h, id: ev.ID}, nil
}

// request builds one HTTP try. GetBody stays nil on purpose: net/http then
// never re-sends the POST by itself on a broken reused connection (it would,
// because of Idempotency-Key), so every HTTP request is one the bridge
// counted.
func (p *payload) request(ctx context.Context, d *destination, now time.Time) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, bytes.NewReader(p.body))
	if err != nil {
		return nil, err
	}
	if !d.faults.keepGetBody {
		req.GetBody = nil
	}
	req.Header = p.headers.Clone()
	if len(d.secrets) > 0 {
		ts := strconv.FormatInt(now.Unix(), 10)
		req.Header.Set("webhook-id", p.id)
		req.Header.Set("webhook-timestamp", ts)
		req.Header.Set("webhook-signature", sign(d.secrets, p.id, ts, p.body))
	}
	return req, nil
}

// sign returns the Standard Webhooks v1 signature header: one
// "v1,<base64 HMAC-SHA256(id.timestamp.body)>" per secret, space-separated.
func sign(secrets [][]byte, id, ts string, body []byte) string {
	sigs := make([]string, 0, len(secrets))
	for _, key := range secrets {
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id + "." + ts + "."))
		mac.Write(body)
		sigs = append(sigs, "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	}
	return strings.Join(sigs, " ")
}
