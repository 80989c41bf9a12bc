package webhook

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
)

// A Signer reused from message to message appends exactly what Sign
// returns for each message, whatever came before (a longer id, a larger
// body, another timestamp), for one and several keys; once warm it
// allocates nothing. The control: a signer that skips the reset between
// messages (its HMAC state then carries the last message) fails the same
// check.
func TestSignerMatchesSign(t *testing.T) {
	keys := [][]byte{[]byte("old-key-old-key-old-key!"), []byte("current-key-current-key!"), []byte("k3")}
	type msg struct {
		id, ts string
		body   []byte
	}
	msgs := []msg{
		{"e1", "1800000000", []byte(`{"a":1}`)},
		{"a-much-longer-event-id-" + strings.Repeat("x", 200), "1800000001", []byte(strings.Repeat(`{"b":2}`, 500))},
		{"e3", "9", nil},
		{"e1", "1800000000", []byte(`{"a":1}`)},
	}
	check := func(t testing.TB, sign func(s *Signer, dst []byte, id, ts string, body []byte) []byte) error {
		for n := 1; n <= len(keys); n++ {
			s := NewSigner(keys[:n])
			var dst []byte
			for i, m := range msgs {
				dst = sign(s, dst[:0], m.id, m.ts, m.body)
				if want := Sign(keys[:n], m.id, m.ts, m.body); string(dst) != want {
					return fmt.Errorf("%d keys, message %d: signer appended %q, Sign returns %q", n, i, dst, want)
				}
			}
			prefix := []byte("kept:")
			if got := sign(s, prefix, msgs[0].id, msgs[0].ts, msgs[0].body); !bytes.Equal(got, append([]byte("kept:"), Sign(keys[:n], msgs[0].id, msgs[0].ts, msgs[0].body)...)) {
				return fmt.Errorf("%d keys: appended %q after a prefix", n, got)
			}
		}
		return nil
	}
	if err := check(t, (*Signer).AppendSign); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "the HMAC state is not reset between messages", func(t testing.TB) error {
		return check(t, func(s *Signer, dst []byte, id, ts string, body []byte) []byte {
			// AppendSign without its Reset.
			s.prefix = append(append(append(append(s.prefix[:0], id...), '.'), ts...), '.')
			for i, m := range s.macs {
				if i > 0 {
					dst = append(dst, ' ')
				}
				m.Write(s.prefix)
				m.Write(body)
				s.sum = m.Sum(s.sum[:0])
				dst = append(dst, "v1,"...)
				dst = base64.StdEncoding.AppendEncode(dst, s.sum)
			}
			return dst
		})
	})

	s, dst := NewSigner(keys[:2]), make([]byte, 0, 256)
	s.AppendSign(dst, "warm", "1", msgs[0].body)
	if n := testing.AllocsPerRun(100, func() { dst = s.AppendSign(dst[:0], msgs[1].id, msgs[1].ts, msgs[1].body) }); n != 0 {
		t.Errorf("AppendSign allocates %v times per message once warm, want 0", n)
	}
}

// expectBroken runs check against a deliberately broken variant and fails
// the test unless check reports the breakage.
func expectBroken(t *testing.T, what string, check func(testing.TB) error) {
	t.Helper()
	if err := check(t); err == nil {
		t.Fatalf("negative control (%s): the check passed against the broken variant", what)
	}
}

func BenchmarkSign(b *testing.B) {
	keys := [][]byte{[]byte("current-key-current-key!")}
	body := bytes.Repeat([]byte("x"), 1024)
	b.Run("Sign", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_ = Sign(keys, "event-1", "1800000000", body)
		}
	})
	b.Run("Signer", func(b *testing.B) {
		s, dst := NewSigner(keys), make([]byte, 0, 128)
		b.ReportAllocs()
		for range b.N {
			dst = s.AppendSign(dst[:0], "event-1", "1800000000", body)
		}
	})
}
