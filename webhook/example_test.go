package webhook_test

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sotercare/jetbridge/webhook"
)

// A receiver verifies the bridge's signature with any of its keys: during
// a rotation the bridge signs with the old and the new key, and a receiver
// that knows either accepts. A changed body, or a request replayed after
// the tolerance, is refused.
func ExampleVerify() {
	oldKey, newKey := []byte("old-secret"), []byte("new-secret")
	now := time.Unix(1_700_000_000, 0)
	body := []byte(`{"resident":"r-7"}`)
	ts := strconv.FormatInt(now.Unix(), 10)

	h := http.Header{}
	h.Set(webhook.HeaderID, "fall-42")
	h.Set(webhook.HeaderTimestamp, ts)
	h.Set(webhook.HeaderSignature, webhook.Sign([][]byte{oldKey, newKey}, "fall-42", ts, body))

	fmt.Println(webhook.Verify(h, body, [][]byte{newKey}, now, webhook.Tolerance))
	fmt.Println(webhook.Verify(h, []byte(`{"resident":"r-8"}`), [][]byte{newKey}, now, webhook.Tolerance))
	err := webhook.Verify(h, body, [][]byte{newKey}, now.Add(time.Hour), webhook.Tolerance)
	fmt.Println(errors.Is(err, webhook.ErrTimestampExpired))
	// Output:
	// <nil>
	// webhook: no signature matches
	// true
}

// A sender that signs many messages with the same keys keeps a Signer per
// goroutine: it appends exactly what Sign returns, reusing its HMAC states
// and buffers from one message to the next.
func ExampleSigner() {
	keys := [][]byte{[]byte("old-secret"), []byte("new-secret")}
	s := webhook.NewSigner(keys)
	var buf []byte
	for _, id := range []string{"fall-42", "fall-43"} {
		body := []byte(`{"event":"` + id + `"}`)
		buf = s.AppendSign(buf[:0], id, "1700000000", body)
		fmt.Println(string(buf) == webhook.Sign(keys, id, "1700000000", body))
	}
	// Output:
	// true
	// true
}
