package idempotency

import (
	"errors"
	"strings"
	"testing"
)

const digest = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"

// Records of every release read, with what each holds; the replica part is
// read when well formed and ignored otherwise; an unreadable value is an
// error that never quotes it.
func TestParseValue(t *testing.T) {
	for in, want := range map[string]Value{
		"done EVENTS.4242.ops-1.example/" + digest + "/events.a/b.x 12 3": {State: StateDone, Stream: "EVENTS", Seq: 12, Delivered: 3,
			Subject: "events.a/b.x", Digest: digest, PID: 4242, Host: "ops-1.example"},
		"inflight EVENTS/" + digest + "/events.x 7 1": {State: StateInFlight, Stream: "EVENTS", Seq: 7, Delivered: 1, Subject: "events.x", Digest: digest},
		"done EVENTS 7 1": {State: StateDone, Stream: "EVENTS", Seq: 7, Delivered: 1},
		// a replica part that is not <pid>.<host>: the record still reads
		"done EVENTS.x/" + digest + "/events.x 7 1":      {State: StateDone, Stream: "EVENTS", Seq: 7, Delivered: 1, Subject: "events.x", Digest: digest},
		"done EVENTS.0.h/" + digest + "/events.x 7 1":    {State: StateDone, Stream: "EVENTS", Seq: 7, Delivered: 1, Subject: "events.x", Digest: digest},
		"done EVENTS.12.h!x/" + digest + "/events.x 7 1": {State: StateDone, Stream: "EVENTS", Seq: 7, Delivered: 1, Subject: "events.x", Digest: digest},
	} {
		got, err := ParseValue([]byte(in))
		if err != nil || got != want {
			t.Errorf("ParseValue(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "done SECRET 1", "gone SECRET 1 1", "done SECRET x 1", "done SECRET/abc/x 1 1",
		"done SECRET/" + strings.Repeat("z", 64) + "/x 1 1", "done /" + digest + "/x 1 1", "done SECRET/" + digest + "/ 1 1",
		"done .1.h/" + digest + "/x 1 1", "done SECRET 1 1 " + strings.Repeat("x", 70000)} {
		_, err := ParseValue([]byte(bad))
		if !errors.Is(err, ErrUnreadable) || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("ParseValue(%.40q): %v, want ErrUnreadable without the value", bad, err)
		}
	}
}

// Replica writes what ParseValue reads back, whatever the host name
// holds: no space, no "/", bounded.
func TestReplica(t *testing.T) {
	for host, want := range map[string]string{
		"ops-1.example":          "4242.ops-1.example",
		"":                       "4242.unknown",
		"evil host/x\x1b":        "4242.evil_host_x_",
		strings.Repeat("h", 100): "4242." + strings.Repeat("h", 64),
		"h\u00e9":                "4242.h__",
	} {
		got := Replica(4242, host)
		if got != want {
			t.Errorf("Replica(4242, %q) = %q, want %q", host, got, want)
			continue
		}
		v, err := ParseValue([]byte("done EVENTS." + got + "/" + digest + "/events.x 1 1"))
		if err != nil || v.PID != 4242 || "4242."+v.Host != want || v.Stream != "EVENTS" {
			t.Errorf("record with replica %q reads as %+v, %v", got, v, err)
		}
	}
}

func TestKey(t *testing.T) {
	if got := Key("ra", "ev-1"); got != "ra.b.ZXYtMQ" {
		t.Errorf("Key = %q", got)
	}
	long := strings.Repeat("x", 97)
	if got := Key("ra", long); !strings.HasPrefix(got, "ra.h.") || len(got) != len("ra.h.")+43 {
		t.Errorf("Key of a 97-byte id = %q, want a hashed key", got)
	}
}
