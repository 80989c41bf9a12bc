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
