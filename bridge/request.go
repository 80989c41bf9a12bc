package bridge

// This file renders a delivery's HTTP request: the body in the
// destination's format (envelope, raw, cloudevents), the headers, and the
// Standard Webhooks signature (docs/delivery.md#the-request).

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/webhook"
)

// payload is what one attempt sends, built once per message (inside its
// event, never reused); each HTTP try
// turns it into a fresh *http.Request (fresh signature timestamp).
//
// An envelope body is one allocation of the right size, not a pooled
// buffer: net/http writes a request's headers and body in one write only
// for a body it knows (*bytes.Reader among them), and such a body cannot
// tell when the transport is done with it (net/http may close it after
// RoundTrip returns), so a pooled buffer could be reused while still being
// sent. One write per request is worth more than one allocation.
type payload struct {
	body    []byte
	headers http.Header // everything but the signature headers; shared by the tries, never written
	id      string
	// vals backs the header values the bridge sets (all of them but
	// cloudevents' own): one allocation with the payload.
	vals [6]string
	// first is the first try's body reader (later tries make their own):
	// one reader per try, since a try's request may still be written after
	// the try (a destination that answers before reading the body); the
	// payload is never reused, so neither is the reader.
	first     bytes.Reader
	firstUsed bool
}

// buildPayload validates the event and renders the body and headers of the
// destination's format. Configured headers go first; the bridge's own
// headers override them; event metadata never becomes a header.
func buildPayload(ev *event, d *destination) (*payload, error) {
	switch {
	case !producer.ValidHeaderValue(ev.ID):
		return nil, &InvalidEventError{Reason: "Event-Id contains a control character"}
	case !producer.ValidHeaderValue(ev.Type):
		return nil, &InvalidEventError{Reason: "Event-Type contains a control character"}
	case !producer.ValidHeaderValue(ev.ContentType):
		return nil, &InvalidEventError{Reason: "Content-Type contains a control character"}
	}
	p := &ev.payload // allocated with the event
	*p = payload{id: ev.ID}
	own := 6 // the headers the bridge sets below
	if d.format == config.FormatCloudEvents {
		own = 12
	}
	// Sized for what it will hold (a map of up to 8 entries is one group).
	// The configured values are shared, not copied: request headers are
	// never written in place, only replaced in a copy (request, inject).
	h := make(http.Header, len(d.baseHeader)+own)
	maps.Copy(h, d.baseHeader)
	// One backing array for the values the bridge sets; the keys are
	// already canonical.
	v := p.vals[:0]
	if own > len(p.vals) {
		v = make([]string, 0, own)
	}
	set := func(k, val string) {
		v = append(v, val)
		h[k] = v[len(v)-1 : len(v) : len(v)]
	}
	switch d.format {
	case config.FormatRaw:
		p.body = ev.Payload
		set("Content-Type", ev.ContentType)
	case config.FormatCloudEvents:
		p.body = ev.Payload
		set("Content-Type", ev.ContentType)
		set("Ce-Specversion", "1.0")
		set("Ce-Id", ev.ID)
		set("Ce-Type", ev.Type)
		set("Ce-Source", "nats://"+ev.Stream+"/"+ev.Subject)
		set("Ce-Subject", ev.Subject)
		set("Ce-Time", ev.PublishedAt.UTC().Format(time.RFC3339Nano))
	default: // envelope
		if !json.Valid(ev.Payload) {
			return nil, &InvalidEventError{Reason: "payload is not JSON (format envelope)"}
		}
		p.body = appendEnvelope(make([]byte, 0, envelopeSize(ev)), ev)
		set("Content-Type", "application/json")
	}
	set("X-Event-Id", ev.ID)
	set("X-Event-Type", ev.Type)
	set("X-Event-Severity", string(ev.Severity))
	set("X-Delivery-Attempt", strconv.FormatUint(ev.Delivered, 10))
	set("Idempotency-Key", ev.ID)
	p.headers = h
	return p, nil
}

// appendEnvelope appends the envelope body (docs/delivery.md#the-request):
//
//	{"id":…,"eventType":…,"severity":…,"subject":…,"metadata":{…},"payload":…,"publishedAt":…}
//
// Strings are escaped exactly as encoding/json escapes them, metadata keys
// come sorted, and the payload, already validated as JSON, is copied as
// is. No reflection, no intermediate buffers.
func appendEnvelope(b []byte, ev *event) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, ev.ID)
	b = append(b, `,"eventType":`...)
	b = appendJSONString(b, ev.Type)
	b = append(b, `,"severity":`...)
	b = appendJSONString(b, string(ev.Severity))
	b = append(b, `,"subject":`...)
	b = appendJSONString(b, ev.Subject)
	b = append(b, `,"metadata":{`...)
	if len(ev.Metadata) > 0 {
		keys := make([]string, 0, len(ev.Metadata))
		for k := range ev.Metadata {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			b = appendJSONString(b, ev.Metadata[k])
		}
	}
	b = append(b, `},"payload":`...)
	b = append(b, ev.Payload...)
	b = append(b, `,"publishedAt":"`...)
	b = ev.PublishedAt.UTC().AppendFormat(b, time.RFC3339Nano)
	return append(b, `"}`...)
}

// envelopeSize is an upper bound of the envelope's length for all but
// heavily escaped strings (which then grow the buffer once).
func envelopeSize(ev *event) int {
	n := 128 + len(ev.Payload) + 2*(len(ev.ID)+len(ev.Type)+len(ev.Subject))
	for k, v := range ev.Metadata {
		n += 6 + 2*(len(k)+len(v))
	}
	return n
}

// appendJSONString appends s as a JSON string, escaped as encoding/json
// does by default: control characters, '"', '\\', '<', '>', '&', U+2028 and
// U+2029 escaped, invalid UTF-8 replaced by U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= ' ' && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// request builds one HTTP try: a copy of the destination's request
// template (its URL parsed once) with this try's context, body and
// headers. GetBody stays nil on purpose: net/http then never re-sends the
// POST by itself on a broken reused connection (it would, because of
// Idempotency-Key), so every HTTP request is one the bridge counted.
// A signed destination's tries sign with a Signer of pipe's (signers).
func (p *payload) request(ctx context.Context, d *destination, pipe *pipeline, now time.Time) (*http.Request, error) {
	req := d.reqTemplate.WithContext(ctx) // a shallow copy; the URL is shared and never written
	// A *bytes.Reader, so that net/http sends headers and body in one
	// write (see payload).
	if len(p.body) > 0 {
		req.Body, req.ContentLength = io.NopCloser(p.reader()), int64(len(p.body))
	} else {
		req.Body = http.NoBody
	}
	req.Header = p.headers
	if len(d.secrets) > 0 {
		req.Header = p.signedHeaders(d, pipe, now)
	}
	return req, nil
}

// The signature headers, canonical (as Header.Set would write them).
var (
	keyWebhookID        = http.CanonicalHeaderKey(webhook.HeaderID)
	keyWebhookTimestamp = http.CanonicalHeaderKey(webhook.HeaderTimestamp)
	keyWebhookSignature = http.CanonicalHeaderKey(webhook.HeaderSignature)
)

// signedHeaders is the headers of one signed try: the payload's and the
// three signature headers, with a fresh timestamp, in a map of the try's
// own (a try's request may still be written after the try returns, so a
// later try never writes into an earlier one's headers). The signature is
// made with a Signer taken from pipe for this call only.
func (p *payload) signedHeaders(d *destination, pipe *pipeline, now time.Time) http.Header {
	h := make(http.Header, len(p.headers)+3)
	maps.Copy(h, p.headers)
	ts := strconv.FormatInt(now.Unix(), 10)
	s := pipe.signer(d)
	s.buf = s.AppendSign(s.buf[:0], p.id, ts, p.body)
	vals := [...]string{p.id, ts, string(s.buf)}
	pipe.putSigner(s)
	v := vals[:] // one backing array for the three values (escapes with h)
	h[keyWebhookID] = v[0:1:1]
	h[keyWebhookTimestamp] = v[1:2:2]
	h[keyWebhookSignature] = v[2:3:3]
	return h
}

// signer is a webhook.Signer with a buffer for its output, one goroutine
// at a time (pipeline.signers).
type signer struct {
	*webhook.Signer
	buf []byte
}

// signer takes a signer of d's keys from p's pool (a new one when p has
// none: a pipeline not built by newPipeline).
func (p *pipeline) signer(d *destination) *signer {
	if p.signers == nil {
		return &signer{Signer: webhook.NewSigner(d.secrets)}
	}
	return p.signers.Get().(*signer)
}

// putSigner gives s back once its output has been copied.
func (p *pipeline) putSigner(s *signer) {
	if p.signers != nil {
		p.signers.Put(s)
	}
}

// reader is a new reader of the body, for one try (see payload.first).
func (p *payload) reader() *bytes.Reader {
	if p.firstUsed {
		return bytes.NewReader(p.body)
	}
	p.firstUsed = true
	p.first.Reset(p.body)
	return &p.first
}

// requestTemplate is the destination's POST, built once: every try copies
// it. userinfo in the URL becomes Basic authorization, as http.Client
// would add it, unless a configured header sets Authorization.
func requestTemplate(raw string, base http.Header) (*http.Request, http.Header, error) {
	req, err := http.NewRequest(http.MethodPost, raw, nil)
	if err != nil {
		return nil, base, err
	}
	if u := req.URL.User; u != nil && base.Get("Authorization") == "" {
		if base == nil {
			base = make(http.Header, 1)
		}
		pass, _ := u.Password()
		base.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+pass)))
	}
	return req, base, nil
}
