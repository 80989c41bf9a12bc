package bridge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

func held(key string, seq uint64) *heldMsg { return &heldMsg{key: key, copySeq: seq} }

func name(h *heldMsg) string { return fmt.Sprintf("%s%d", h.key, h.copySeq) }

// backoffFunc is what a route does with a head whose attempt is to be
// retried after d.
type backoffFunc func(tab *keyTable, h *heldMsg, d time.Duration)

// holdInProcess is the ordered route's way: the head stays in the table.
func holdInProcess(tab *keyTable, h *heldMsg, d time.Duration) { tab.hold(h, d) }

// nakWithDelay is the unordered route's way, as the broken variant: the
// message leaves the process and JetStream redelivers it after d.
func nakWithDelay(tab *keyTable, h *heldMsg, d time.Duration) {
	again := held(h.key, h.copySeq)
	tab.done(h)
	time.AfterFunc(d, func() { tab.add(again) })
}

type success struct {
	name string
	at   time.Time
}

// backoffScenario holds A1, B2, A3, B4 (key and copy sequence); A1's first attempt
// fails and is retried after d through backoff, every other attempt
// succeeds. It returns the successes in order, and when A1 failed.
func backoffScenario(t *testing.T, d time.Duration, backoff backoffFunc) ([]success, time.Time) {
	t.Helper()
	tab := newKeyTable(64)
	t.Cleanup(tab.close)
	for i, k := range []string{"A", "B", "A", "B"} {
		if !tab.add(held(k, uint64(i+1))) {
			t.Fatalf("add %s%d refused", k, i+1)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []success
	var failedAt time.Time
	for len(out) < 4 {
		h, err := tab.next(ctx)
		if err != nil {
			t.Fatalf("next after %v: %v", out, err)
		}
		if name(h) == "A1" && failedAt.IsZero() {
			failedAt = time.Now()
			backoff(tab, h, d)
			continue
		}
		out = append(out, success{name(h), time.Now()})
		tab.done(h)
	}
	return out, failedAt
}

// inversions counts, per key, the successes that come after a success of
// a later message of the same key.
func inversions(out []success) int {
	n := 0
	last := map[byte]byte{}
	for _, s := range out {
		k, seq := s.name[0], s.name[1]
		if seq < last[k] {
			n++
		}
		last[k] = max(last[k], seq)
	}
	return n
}

// A redelivery backoff on key A holds A's later message (A3 is sent only
// after A1 succeeded, after the backoff) and not key B's (B2 and B4 are
// sent during A's backoff). The negative control hands A1 back to
// JetStream with a delay instead, as an unordered route does: A3 then
// overtakes A1.
func TestKeyTableBackoffHoldsOnlyItsKey(t *testing.T) {
	const d = 400 * time.Millisecond
	out, failedAt := backoffScenario(t, d, holdInProcess)
	names := make([]string, len(out))
	for i, s := range out {
		names[i] = s.name
	}
	if want := []string{"B2", "B4", "A1", "A3"}; !slices.Equal(names, want) {
		t.Fatalf("successes %v, want %v", names, want)
	}
	for _, s := range out[:2] {
		if s.at.Sub(failedAt) >= d {
			t.Errorf("%s waited for A's backoff (%v after A1 failed)", s.name, s.at.Sub(failedAt))
		}
	}
	if got := out[2].at.Sub(failedAt); got < d {
		t.Errorf("A1 retried %v after it failed, before its backoff of %v", got, d)
	}
	if n := inversions(out); n != 0 {
		t.Errorf("%d inversions", n)
	}

	control, _ := backoffScenario(t, d, nakWithDelay)
	if n := inversions(control); n == 0 {
		t.Errorf("control: handing A1 back with a delay gave no inversion: %v", control)
	}
}

// At most one head per key is out at a time, and only heads: with three
// keys of three messages, three attempts can start, one per key, each its
// key's first message; the next of a key comes when its head is done.
// The negative control marks a head done twice over (two heads of one key
// out): the second call changes nothing.
func TestKeyTableOneHeadPerKey(t *testing.T) {
	tab := newKeyTable(64)
	defer tab.close()
	for seq := uint64(1); seq <= 9; seq++ {
		tab.add(held(fmt.Sprintf("K%d", seq%3), seq))
	}
	var out []*heldMsg
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		h, err := tab.next(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
	var names []string
	for _, h := range out {
		names = append(names, name(h))
	}
	if want := []string{"K11", "K22", "K03"}; !slices.Equal(names, want) {
		t.Fatalf("heads out at once: %v, want %v", names, want)
	}
	tab.done(out[0])
	tab.done(out[0]) // already done: ignored
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h, err := tab.next(ctx)
	if err != nil || name(h) != "K14" {
		t.Fatalf("after K11 is done: %v, %v; want K14", h, err)
	}
	if got := tab.room(); got != 64-8 {
		t.Errorf("room %d, want %d", got, 64-8)
	}
}

// The table holds at most its capacity; a message it holds already (a
// redelivery) is not added twice; an earlier message of a key becomes its
// head unless the head is being attempted.
func TestKeyTableCapacityAndPlace(t *testing.T) {
	tab := newKeyTable(3)
	defer tab.close()
	if !tab.add(held("A", 5)) || !tab.add(held("B", 6)) {
		t.Fatal("add refused")
	}
	if tab.add(held("A", 5)) {
		t.Error("a message held already was added again")
	}
	if !tab.add(held("A", 2)) {
		t.Fatal("add A2 refused")
	}
	if tab.add(held("C", 9)) || tab.room() != 0 {
		t.Errorf("a full table took more (room %d)", tab.room())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h, err := tab.next(ctx)
	if err != nil || name(h) != "A2" {
		t.Fatalf("first head %v, %v; want A2 (the earlier copy sequence)", h, err)
	}
	tab.done(h)
	h, _ = tab.next(ctx) // B6
	h2, _ := tab.next(ctx)
	if name(h) != "B6" || name(h2) != "A5" {
		t.Fatalf("heads %s, %s; want B6, A5", name(h), name(h2))
	}
	if !tab.add(held("A", 1)) { // redelivered from before: A5 is being attempted
		t.Fatal("add A1 refused")
	}
	tab.done(h2)
	h, _ = tab.next(ctx)
	if name(h) != "A1" {
		t.Errorf("after A5: %s, want A1 (queued behind the head being attempted)", name(h))
	}
}

// Handing a key back returns its messages in copy order, except a head
// being attempted; every held message, a head in backoff included, is
// given for progress acks; once closed, a key in backoff never becomes
// ready again.
func TestKeyTableHandBackProgressClose(t *testing.T) {
	tab := newKeyTable(16)
	for _, seq := range []uint64{3, 1, 2} {
		tab.add(held("A", seq))
	}
	tab.add(held("B", 4))
	tab.add(held("B", 5))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a, _ := tab.next(ctx) // A1
	b, _ := tab.next(ctx) // B4
	tab.hold(b, time.Hour)
	if got := len(tab.heldMsgs()); got != 5 {
		t.Errorf("%d messages for progress acks, want 5", got)
	}
	var names []string
	for _, h := range tab.handBack("A") {
		names = append(names, name(h))
	}
	if !slices.Equal(names, []string{"A2", "A3"}) {
		t.Errorf("handed back %v, want [A2 A3] (A1 is being attempted)", names)
	}
	names = nil
	for _, h := range tab.handBack("B") {
		names = append(names, name(h))
	}
	if !slices.Equal(names, []string{"B4", "B5"}) {
		t.Errorf("handed back %v, want [B4 B5]", names)
	}
	if got := tab.room(); got != 15 {
		t.Errorf("room %d, want 15 (A1 still held)", got)
	}
	tab.done(a)

	tab.add(held("C", 6))
	c, _ := tab.next(ctx)
	tab.hold(c, 50*time.Millisecond)
	tab.close()
	wctx, wcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer wcancel()
	if h, err := tab.next(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("after close, next gave %v, %v", h, err)
	}
	if tab.add(held("D", 7)) {
		t.Error("a closed table took a message")
	}
}

// A dead-lettered head blocks its key (on_dead_letter: block): none of
// its held messages is handed out, and later ones are held too, while
// other keys go on; only the replay of that dead letter re-opens the key,
// at its head (before the messages held since), and the key resumes in
// copy order. The control is the replay of another dead letter, which
// re-opens nothing.
func TestKeyTableBlockReopen(t *testing.T) {
	tab := newKeyTable(16)
	defer tab.close()
	for _, seq := range []uint64{1, 2} {
		tab.add(held("A", seq))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a1, _ := tab.next(ctx)
	tab.block(a1, 7)
	tab.add(held("A", 3))
	tab.add(held("B", 4))
	if h, _ := tab.next(ctx); name(h) != "B4" {
		t.Fatalf("next %s, want B4 (A is blocked)", name(h))
	}
	if got := tab.blockedKeys(); got["A"] != 2 || len(got) != 1 {
		t.Errorf("blocked keys %v, want A holding 2", got)
	}
	other := held("A", 9)
	other.replayOf = 8
	if tab.reopen(other) {
		t.Fatal("the replay of another dead letter re-opened the key")
	}
	replay := held("A", 10)
	replay.replayOf = 7
	if !tab.reopen(replay) {
		t.Fatal("the replay of the key's dead letter did not re-open it")
	}
	var names []string
	for range 3 {
		h, err := tab.next(ctx)
		if err != nil {
			t.Fatalf("after %v: %v", names, err)
		}
		names = append(names, name(h))
		tab.done(h)
	}
	if want := []string{"A10", "A2", "A3"}; !slices.Equal(names, want) {
		t.Errorf("after the replay: %v, want %v", names, want)
	}
	if got := tab.blockedKeys(); len(got) != 0 {
		t.Errorf("still blocked: %v", got)
	}
}
