// Package webhook signs and verifies Standard Webhooks (v1) signatures, as
// the bridge sends them (docs/delivery.md#the-request): the webhook-signature
// header holds one "v1,<base64 HMAC-SHA256 of id.timestamp.body>" per
// signing key, space-separated, so that keys can be rotated. A receiver
// verifies with any of its keys and refuses a timestamp outside a
// tolerance, which bounds replays.
//
// Invariant: Verify returns nil only when a v1 signature in the request is
// the HMAC-SHA256 of exactly its id, timestamp and body under one of the
// receiver's keys (compared in constant time) and the timestamp is within
// the tolerance of now; otherwise it returns one of the Err* values, for
// errors.Is, and never says which key or signature came closest.
//
// A Signer appends exactly what Sign returns, for one goroutine at a time,
// reusing its HMAC states and buffers from one message to the next.
//
// It depends on the standard library only, so a receiver service can use
// it without the bridge.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"hash"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The headers of a signed request.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// Tolerance is the usual bound on the age (or earliness) of a signature's
// timestamp.
const Tolerance = 5 * time.Minute

// Verification failures.
var (
	ErrUnsigned          = errors.New("webhook: missing webhook-id, webhook-timestamp or webhook-signature")
	ErrBadTimestamp      = errors.New("webhook: webhook-timestamp is not a Unix time")
	ErrTimestampExpired  = errors.New("webhook: webhook-timestamp outside the tolerance")
	ErrSignatureMismatch = errors.New("webhook: no signature matches")
)

// Sign returns the webhook-signature header value for the message id, the
// timestamp ts (Unix seconds) and the body: one v1 signature per key.
func Sign(keys [][]byte, id, ts string, body []byte) string {
	sigs := make([]string, 0, len(keys))
	for _, key := range keys {
		sigs = append(sigs, "v1,"+base64.StdEncoding.EncodeToString(mac(key, id, ts, body)))
	}
	return strings.Join(sigs, " ")
}

// Signer signs messages with fixed keys without allocating per message
// once warm: one HMAC-SHA256 state per key, reset (to its keyed state)
// for each message, and a scratch buffer for the signed prefix. A Signer
// is not safe for concurrent use: each goroutine needs its own (or takes
// one from a pool for the length of one AppendSign call).
type Signer struct {
	macs   []hash.Hash
	prefix []byte // id.ts.
	sum    []byte
}

// NewSigner returns a Signer for keys (one signature per key, in order);
// it keeps no reference to keys.
func NewSigner(keys [][]byte) *Signer {
	s := &Signer{macs: make([]hash.Hash, len(keys)), sum: make([]byte, 0, sha256.Size)}
	for i, k := range keys {
		s.macs[i] = hmac.New(sha256.New, k)
	}
	return s
}

// AppendSign appends Sign(keys, id, ts, body) to dst: the
// webhook-signature header value, byte for byte.
func (s *Signer) AppendSign(dst []byte, id, ts string, body []byte) []byte {
	s.prefix = append(append(append(append(s.prefix[:0], id...), '.'), ts...), '.')
	for i, m := range s.macs {
		if i > 0 {
			dst = append(dst, ' ')
		}
		m.Reset()
		m.Write(s.prefix)
		m.Write(body)
		s.sum = m.Sum(s.sum[:0])
		dst = append(dst, "v1,"...)
		dst = base64.StdEncoding.AppendEncode(dst, s.sum)
	}
	return dst
}

// Verify checks the signature headers of a request with body: a v1
// signature made with one of keys, and a timestamp within tolerance of
// now. It returns nil or one of the errors above.
func Verify(h http.Header, body []byte, keys [][]byte, now time.Time, tolerance time.Duration) error {
	id, ts, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || ts == "" || sigs == "" {
		return ErrUnsigned
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return ErrBadTimestamp
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return ErrTimestampExpired
	}
	for _, key := range keys {
		want := mac(key, id, ts, body)
		for s := range strings.FieldsSeq(sigs) {
			b64, ok := strings.CutPrefix(s, "v1,")
			if !ok {
				continue
			}
			if got, err := base64.StdEncoding.DecodeString(b64); err == nil && hmac.Equal(got, want) {
				return nil
			}
		}
	}
	return ErrSignatureMismatch
}

func mac(key []byte, id, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	return m.Sum(nil)
}
