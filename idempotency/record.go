package idempotency

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// State is the state of a record.
type State string

// Record states, as stored.
const (
	// StateInFlight: a delivery holds the event id; its HTTP tries run.
	StateInFlight State = "inflight"
	// StateDone: the event was delivered (a 2xx).
	StateDone State = "done"
)

// ErrUnreadable is matched by the error of a value that is not a record.
var ErrUnreadable = errors.New("idempotency: unreadable record")

// maxKeyIDBytes is the longest event id that a key holds readably
// (base64url); a longer one is hashed.
const maxKeyIDBytes = 96

// Key is the bucket key of the record of eventID on route:
// <route>.b.<base64url of the id> for ids up to 96 bytes,
// <route>.h.<base64url of its SHA-256> for longer ones. Always a valid key
// whatever bytes the id holds.
func Key(route, eventID string) string {
	if len(eventID) <= maxKeyIDBytes {
		return route + ".b." + base64.RawURLEncoding.EncodeToString([]byte(eventID))
	}
	sum := sha256.Sum256([]byte(eventID))
	return route + ".h." + base64.RawURLEncoding.EncodeToString(sum[:])
}

// Value is a decoded record value. Every field comes from the bucket and
// is untrusted; ParseValue checks its form only.
type Value struct {
	State     State
	Stream    string // the stream of the message that took the record
	Seq       uint64 // its stream sequence
	Delivered uint64 // its delivery count
	Subject   string // its subject; "" in a record written before 0.1.0
	Digest    string // SHA-256 of its payload, hex; "" before 0.1.0
	PID       int    // the writing replica's process id; 0 before this release
	Host      string // the writing replica's host name; "" before this release
}

// maxHost bounds the host name a record holds, in bytes.
const maxHost = 64

// Replica is the replica part of a record written by process pid on host
// (the text after the stream's first "."): "<pid>.<host>", the host name
// cut at 64 bytes with every byte outside [A-Za-z0-9._-] replaced by "_"
// (so it holds no space and no "/"), "unknown" when empty.
func Replica(pid int, host string) string {
	if len(host) > maxHost {
		host = host[:maxHost]
	}
	b := []byte(host)
	for i, c := range b {
		if !hostByte(c) {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		b = []byte("unknown")
	}
	return strconv.Itoa(pid) + "." + string(b)
}

func hostByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_'
}

// unreadable is ParseValue's error: it gives the size, never the value.
func unreadable(b []byte) error {
	return fmt.Errorf("%w (%d bytes)", ErrUnreadable, len(b))
}

// maxValue bounds a record value: the bridge writes a few hundred bytes at
// most (a subject is bounded by the server's max_payload, in practice far
// shorter).
const maxValue = 64 << 10

// ParseValue decodes a record value (see the package documentation). A
// replica part that is not "<pid>.<host>" leaves PID and Host empty: the
// record still reads, as every release reads it.
func ParseValue(b []byte) (Value, error) {
	if len(b) > maxValue {
		return Value{}, unreadable(b)
	}
	f := strings.Fields(string(b))
	if len(f) != 4 || (f[0] != string(StateInFlight) && f[0] != string(StateDone)) {
		return Value{}, unreadable(b)
	}
	seq, err1 := strconv.ParseUint(f[2], 10, 64)
	n, err2 := strconv.ParseUint(f[3], 10, 64)
	if err1 != nil || err2 != nil {
		return Value{}, unreadable(b)
	}
	v := Value{State: State(f[0]), Stream: f[1], Seq: seq, Delivered: n}
	if strings.IndexByte(f[1], '/') >= 0 {
		c := strings.SplitN(f[1], "/", 3)
		if len(c) != 3 || c[0] == "" || c[2] == "" || len(c[1]) != 2*sha256.Size {
			return Value{}, unreadable(b)
		}
		if _, err := hex.DecodeString(c[1]); err != nil {
			return Value{}, unreadable(b)
		}
		v.Stream, v.Digest, v.Subject = c[0], c[1], c[2]
	}
	// A stream name holds no ".": what follows the first one is the
	// replica.
	if i := strings.IndexByte(v.Stream, '.'); i >= 0 {
		replica := v.Stream[i+1:]
		v.Stream = v.Stream[:i]
		if v.Stream == "" {
			return Value{}, unreadable(b)
		}
		pid, host, ok := strings.Cut(replica, ".")
		if p, err := strconv.Atoi(pid); ok && err == nil && p > 0 && host != "" && len(host) <= maxHost && validHost(host) {
			v.PID, v.Host = p, host
		}
	}
	return v, nil
}

func validHost(h string) bool {
	for i := 0; i < len(h); i++ {
		if !hostByte(h[i]) {
			return false
		}
	}
	return true
}
