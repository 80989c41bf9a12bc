package natstest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Publish retry bounds: each try waits up to publishTryTimeout for its
// PubAck; a failed try is repeated with the same Nats-Msg-Id (the broker's
// dedup window makes that safe) until publishDeadline has passed.
const (
	publishTryTimeout = 2 * time.Second
	publishRetryPause = 50 * time.Millisecond
	publishDeadline   = 30 * time.Second
)

// Ledger is the accounting of a no-loss test (reliability.md, invariant
// I1): it publishes n events with known ids, is told which ids reached the
// destination and which were dead-lettered, and checks at quiescence that
// every event is accounted for, counting the duplicates per event.
//
// Event i (1-based) has the id "<prefix>-<i>" (Nats-Msg-Id, hence also the
// bridge's event id) and the JSON payload {"n":i}. A Ledger is safe for
// concurrent use.
type Ledger struct {
	prefix string
	n      int

	mu        sync.Mutex
	delivered map[string]int // id -> deliveries recorded
	dead      map[string]int // id -> dead letters read
	retries   int            // publish tries repeated after an error
}

// NewLedger returns a ledger of n events with ids "<prefix>-1" to
// "<prefix>-n".
func NewLedger(prefix string, n int) *Ledger {
	return &Ledger{prefix: prefix, n: n, delivered: map[string]int{}, dead: map[string]int{}}
}

// Prefix is the prefix of the ledger's event ids.
func (l *Ledger) Prefix() string { return l.prefix }

// N is the number of events in the ledger.
func (l *Ledger) N() int { return l.n }

// ID is the id of event i (1-based).
func (l *Ledger) ID(i int) string { return fmt.Sprintf("%s-%d", l.prefix, i) }

// IDs lists every event id, in order.
func (l *Ledger) IDs() []string {
	ids := make([]string, l.n)
	for i := range ids {
		ids[i] = l.ID(i + 1)
	}
	return ids
}

// Publish publishes every event of the ledger to subject, in order; see
// PublishOne.
func (l *Ledger) Publish(t testing.TB, js jetstream.JetStream, subject string) {
	t.Helper()
	for i := 1; i <= l.n; i++ {
		l.PublishOne(t, js, subject, i)
	}
}

// PublishOne publishes event i to subject with Nats-Msg-Id = its id and
// waits for the PubAck. A failed try (a timeout, no responders while the
// server restarts, a leader change) is repeated with the same id until it
// succeeds, for up to 30 s; then the test fails. A repeat that the broker
// reports as a duplicate is a success: the earlier try was stored.
func (l *Ledger) PublishOne(t testing.TB, js jetstream.JetStream, subject string, i int) {
	t.Helper()
	if i < 1 || i > l.n {
		t.Fatalf("natstest: ledger: event %d out of range 1..%d", i, l.n)
	}
	id := l.ID(i)
	payload := fmt.Appendf(nil, `{"n":%d}`, i)
	deadline := time.Now().Add(publishDeadline)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), publishTryTimeout)
		_, err := js.Publish(ctx, subject, payload, jetstream.WithMsgID(id))
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("natstest: ledger: publish %s to %s: still failing after %s: %v", id, subject, publishDeadline, err)
		}
		l.mu.Lock()
		l.retries++
		l.mu.Unlock()
		time.Sleep(publishRetryPause) // a pause between tries, not a wait for a condition
	}
}

// Delivered records one delivery of each id (an id may repeat: that is a
// duplicate). Feed it the X-Event-Id of every request the destination
// received. Calls accumulate.
func (l *Ledger) Delivered(ids ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		l.delivered[id]++
	}
}

// ReadDeadLetters reads every message of the dead-letter stream and records
// its Event-Id header as dead-lettered. It replaces what an earlier call
// recorded, so it can be called again after more dead letters arrived.
func (l *Ledger) ReadDeadLetters(t testing.TB, js jetstream.JetStream, stream string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("natstest: ledger: dead-letter stream %s: %v", stream, err)
	}
	st := s.CachedInfo().State
	dead := map[string]int{}
	for seq := st.FirstSeq; st.Msgs > 0 && seq <= st.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted (e.g. replayed) in the meantime
		}
		if err != nil {
			t.Fatalf("natstest: ledger: dead letter %s seq %d: %v", stream, seq, err)
		}
		dead[m.Header.Get("Event-Id")]++
	}
	l.mu.Lock()
	l.dead = dead
	l.mu.Unlock()
}

// LedgerReport is what Check found.
type LedgerReport struct {
	Total          int            // events published
	Delivered      int            // distinct ledger ids delivered at least once
	DeadLettered   int            // distinct ledger ids dead-lettered at least once
	Missing        []string       // ids neither delivered nor dead-lettered, in ledger order
	Duplicates     map[string]int // id -> deliveries beyond the first (only ids with some)
	DuplicateCount int            // sum of Duplicates
	Both           []string       // ids both delivered and dead-lettered (sorted)
	Unknown        []string       // delivered or dead-lettered ids the ledger never published (sorted)
	PublishRetries int            // publish tries repeated after an error
}

// Check compares what was published with what was recorded. The error is
// non-nil when an event is missing or an unknown id was recorded; the
// report says which. Duplicates are counted, not judged: the bound depends
// on the scenario.
func (l *Ledger) Check() (LedgerReport, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := LedgerReport{Total: l.n, Duplicates: map[string]int{}, PublishRetries: l.retries}
	known := make(map[string]bool, l.n)
	for i := 1; i <= l.n; i++ {
		id := l.ID(i)
		known[id] = true
		d, dl := l.delivered[id], l.dead[id]
		if d > 0 {
			r.Delivered++
		}
		if dl > 0 {
			r.DeadLettered++
		}
		if d > 0 && dl > 0 {
			r.Both = append(r.Both, id)
		}
		if d == 0 && dl == 0 {
			r.Missing = append(r.Missing, id)
		}
		if d > 1 {
			r.Duplicates[id] = d - 1
			r.DuplicateCount += d - 1
		}
	}
	for _, m := range []map[string]int{l.delivered, l.dead} {
		for id := range m {
			if !known[id] && !slices.Contains(r.Unknown, id) {
				r.Unknown = append(r.Unknown, id)
			}
		}
	}
	slices.Sort(r.Both)
	slices.Sort(r.Unknown)
	var errs []string
	if len(r.Missing) > 0 {
		errs = append(errs, fmt.Sprintf("%d of %d events missing (first: %s)", len(r.Missing), r.Total, firstFew(r.Missing)))
	}
	if len(r.Unknown) > 0 {
		errs = append(errs, fmt.Sprintf("%d ids recorded that were never published (%s)", len(r.Unknown), firstFew(r.Unknown)))
	}
	if len(errs) > 0 {
		return r, fmt.Errorf("natstest: ledger: %s; %s", strings.Join(errs, "; "), r)
	}
	return r, nil
}

// String summarises the report on one line.
func (r LedgerReport) String() string {
	return fmt.Sprintf("total %d, delivered %d, dead-lettered %d, missing %d, duplicates %d over %d events, both %d, unknown %d, publish retries %d",
		r.Total, r.Delivered, r.DeadLettered, len(r.Missing), r.DuplicateCount, len(r.Duplicates), len(r.Both), len(r.Unknown), r.PublishRetries)
}

func firstFew(ids []string) string {
	const max = 5
	if len(ids) <= max {
		return strings.Join(ids, ", ")
	}
	return strings.Join(ids[:max], ", ") + ", …"
}
