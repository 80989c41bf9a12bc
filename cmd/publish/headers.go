package main

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/tracing"
)

// reservedHeaders are the headers publish sets itself (from --id, --type,
// --severity, --meta and the payload) or that tracing writes: -H may not
// set them, in any case.
var reservedHeaders = []string{
	"Nats-Msg-Id", producer.HeaderEventID, producer.HeaderEventType, producer.HeaderEventSeverity,
	producer.HeaderContentType, tracing.HeaderTraceparent, tracing.HeaderTracestate,
}

// parseHeaders turns repeated -H Key:Value into a header, as nats pub -H
// does: split at the first colon, spaces around the name and the value
// trimmed, a key given twice keeps both values in order, names kept in the
// case given. A name must be an HTTP token (it becomes an HTTP header at
// the destination) and not one publish sets itself; a value must have no
// control characters. Errors name the entry and the key, never the value
// (a header value may be a secret).
func parseHeaders(kvs []string) (nats.Header, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	h := nats.Header{}
	for i, kv := range kvs {
		k, v, ok := strings.Cut(kv, ":")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case !ok:
			return nil, usagef("-H: entry %d has no ':'; want Key:Value, e.g. -H X-Tenant:acme", i+1)
		case k == "":
			return nil, usagef("-H: entry %d has an empty name; want Key:Value", i+1)
		case !headerToken(k):
			return nil, usagef("-H %q: not a header name (letters, digits and !#$%%&'*+-.^_`|~ only)", k)
		case !producer.ValidHeaderValue(v):
			return nil, usagef("-H %s: the value has a control character", k)
		}
		for _, r := range reservedHeaders {
			if strings.EqualFold(k, r) {
				return nil, usagef("-H %s: publish sets this header itself (use --id, --type, --severity, --meta, or $TRACEPARENT)", k)
			}
		}
		if strings.HasPrefix(strings.ToLower(k), strings.ToLower(producer.HeaderMetaPrefix)) {
			return nil, usagef("-H %s: an %s header is event metadata: use --meta %s=VALUE", k, producer.HeaderMetaPrefix, k[len(producer.HeaderMetaPrefix):])
		}
		h.Add(k, v)
	}
	return h, nil
}

// headerToken reports whether k is an HTTP token (RFC 9110).
func headerToken(k string) bool {
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return k != ""
}

// headerHook is the producer's header hook: the -H headers, then the
// trace of $TRACEPARENT (docs/tracing.md).
func headerHook(extra nats.Header) func(context.Context, nats.Header) {
	return func(ctx context.Context, h nats.Header) {
		for k, vs := range extra {
			h[k] = append([]string(nil), vs...)
		}
		tracing.InjectEnvironment(ctx, h)
	}
}
