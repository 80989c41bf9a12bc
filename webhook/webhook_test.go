package webhook

import (
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"
)

func TestSignVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	old, cur := []byte("old-key-old-key-old-key!"), []byte("current-key-current-key!")
	body := []byte(`{"a":1}`)
	ts := strconv.FormatInt(now.Unix(), 10)
	signed := func(keys [][]byte, ts string, body []byte) http.Header {
		return http.Header{"Webhook-Id": {"e1"}, "Webhook-Timestamp": {ts}, "Webhook-Signature": {Sign(keys, "e1", ts, body)}}
	}
	tests := []struct {
		name string
		h    http.Header
		body []byte
		keys [][]byte
		want error
	}{
		{"current key", signed([][]byte{cur}, ts, body), body, [][]byte{cur}, nil},
		{"rotation: signed with both, verified with the old", signed([][]byte{old, cur}, ts, body), body, [][]byte{old}, nil},
		{"wrong key", signed([][]byte{cur}, ts, body), body, [][]byte{old}, ErrSignatureMismatch},
		{"body changed", signed([][]byte{cur}, ts, body), []byte(`{"a":2}`), [][]byte{cur}, ErrSignatureMismatch},
		{"unsigned", http.Header{}, body, [][]byte{cur}, ErrUnsigned},
		{"bad timestamp", signed([][]byte{cur}, "soon", body), body, [][]byte{cur}, ErrBadTimestamp},
		{"too old", signed([][]byte{cur}, strconv.FormatInt(now.Add(-6*time.Minute).Unix(), 10), body), body, [][]byte{cur}, ErrTimestampExpired},
		{"too early", signed([][]byte{cur}, strconv.FormatInt(now.Add(6*time.Minute).Unix(), 10), body), body, [][]byte{cur}, ErrTimestampExpired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := Verify(tt.h, tt.body, tt.keys, now, Tolerance); !errors.Is(err, tt.want) {
				t.Fatalf("Verify = %v, want %v", err, tt.want)
			}
		})
	}
}
