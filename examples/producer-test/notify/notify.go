// Package notify is a small webhook receiver for jetbridge deliveries: it
// verifies the Standard Webhooks signature, decodes the envelope, ignores
// an event it has already handled (Idempotency-Key) and rejects an order
// it cannot use with 422, which the bridge dead-letters.
package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Handler receives order.created deliveries.
type Handler struct {
	key []byte // the HMAC key: base64 decoding of the whsec_ secret

	mu     sync.Mutex
	seen   map[string]bool
	orders []Order
}

// Order is the part of the event's payload the receiver uses.
type Order struct {
	ID    string `json:"id"`
	Cents int    `json:"cents"`
}

// NewHandler verifies signatures with secret ("whsec_" and base64).
func NewHandler(secret string) (*Handler, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return nil, err
	}
	return &Handler{key: key, seen: map[string]bool{}}, nil
}

// Orders are the orders accepted so far, each once.
func (h *Handler) Orders() []Order {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Order(nil), h.orders...)
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "read", http.StatusBadRequest)
		return
	}
	if !h.signed(r.Header, body) {
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var env struct {
		Payload Order `json:"payload"`
	}
	if err := json.Unmarshal(body, &env); err != nil || env.Payload.ID == "" || env.Payload.Cents <= 0 {
		http.Error(w, "not an order", http.StatusUnprocessableEntity)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if key := r.Header.Get("Idempotency-Key"); !h.seen[key] {
		h.seen[key] = true
		h.orders = append(h.orders, env.Payload)
	}
	w.WriteHeader(http.StatusNoContent)
}

// signed checks the webhook-signature header: base64 HMAC-SHA256 of
// "webhook-id.webhook-timestamp.body" (a real receiver also bounds the
// timestamp's age).
func (h *Handler) signed(hd http.Header, body []byte) bool {
	mac := hmac.New(sha256.New, h.key)
	mac.Write([]byte(hd.Get("webhook-id") + "." + hd.Get("webhook-timestamp") + "."))
	mac.Write(body)
	want := mac.Sum(nil)
	for _, sig := range strings.Fields(hd.Get("webhook-signature")) {
		if got, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(sig, "v1,")); err == nil && hmac.Equal(got, want) {
			return true
		}
	}
	return false
}
