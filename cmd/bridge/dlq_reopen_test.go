package main

import (
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// dlqOrderedConfig is dlqConfig's shape with one ordered route, ro, whose
// dead letters block their key (one partition: the copy is pulled in
// publishing order). The destination answers 400: every try is a dead
// letter.
const dlqOrderedConfig = `
nats:
  url: "%s"
  embedded: {listen: "%s", store_dir: "%s"}
admin: {listen: ""}
log: {level: error}
destinations:
  d:
    url: %s
    timeout: 1s
    circuit_breaker: {enabled: false}
routes:
  - name: ro
    subjects: ["events.info.o.>"]
    destination: d
    ack_wait: 5s
    ordering: {key: {tokens: [4]}, partitions: 1, on_dead_letter: block}
`

// Purging the dead letter that blocks a key re-opens it: dlq purge prints
// "re-opened key ID of route ro", and the key's next event, held behind
// the block, is tried (and dead-lettered in turn) while a later key's
// event shows the route went on. The control deletes the same dead letter
// without the command (the queue's own delete): the block record stays,
// and the key's next event stays held while the later key's is
// dead-lettered.
func TestDLQPurgeReopensBlockedKey(t *testing.T) {
	run := func(t *testing.T, viaCommand bool) error {
		e := newDLQEnvFrom(t, 400, dlqOrderedConfig)
		e.publishEvent("k1-1", "k1-1", "events.info.o.k1", `{}`)
		e.waitDeadLetters(1)
		first := e.streamMsgs("EVENTS_DLQ") // its sequence: the only one
		e.publishEvent("k1-2", "k1-2", "events.info.o.k1", `{}`)
		e.publishEvent("k2-1", "k2-1", "events.info.o.k2", `{}`)
		e.waitDeadLetters(2) // k2-1: k1-2, before it in the copy, is held
		if viaCommand {
			r := e.run("dlq", "purge", fmt.Sprint(first))
			want := regexp.MustCompile(fmt.Sprintf(`^deleted %d\nre-opened key [0-9a-f]{16} of route ro\ndeleted 1, failed 0\n$`, first))
			if r.code != 0 || !want.MatchString(r.stdout) {
				return fmt.Errorf("dlq purge: %s", r)
			}
		} else {
			s, err := e.js.Stream(e.ctx(), "EVENTS_DLQ")
			if err != nil {
				return err
			}
			if err := s.DeleteMsg(e.ctx(), first); err != nil {
				return err
			}
		}
		// Left: k2-1's dead letter. Then k3-1's, and k1-2's when its key
		// is re-opened (it is before k3-1 in the copy).
		e.publishEvent("k3-1", "k3-1", "events.info.o.k3", `{}`)
		if err := natstest.Poll(15*time.Second, func() error {
			if n := e.streamMsgs("EVENTS_DLQ"); n < 2 {
				return fmt.Errorf("%d dead letters", n)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("k3-1 not dead-lettered: %w", err)
		}
		if err := natstest.Poll(5*time.Second, func() error {
			if n := e.streamMsgs("EVENTS_DLQ"); n != 3 {
				return fmt.Errorf("%d dead letters, want 3 (k2-1, k3-1 and k1-2): k1's key is still blocked", n)
			}
			return nil
		}); err != nil {
			return err
		}
		r := e.run("dlq", "list", "--json")
		for _, id := range []string{"k1-2", "k2-1", "k3-1"} {
			if !regexp.MustCompile(`"` + id + `"`).MatchString(r.stdout) {
				return fmt.Errorf("%s is not among the dead letters:\n%s", id, r.stdout)
			}
		}
		return nil
	}
	if err := run(t, true); err != nil {
		t.Fatal(err)
	}
	t.Run("negative control: the dead letter deleted without the command", func(t *testing.T) {
		if err := run(t, false); err == nil {
			t.Fatal("k1-2 was tried without its block record deleted: the check cannot tell a re-opened key")
		} else {
			t.Logf("caught, as it should: %v", err)
		}
	})
}
