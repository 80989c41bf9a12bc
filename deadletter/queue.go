package deadletter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
)

// listWait bounds one wait for the next dead letter while listing. When it
// passes, List asks the server whether anything is still pending, so a dead
// letter deleted while being listed cannot make List wait forever.
const listWait = time.Second

// listInactive is how long the server keeps List's ephemeral consumer
// when the client vanished without deleting it.
const listInactive = 30 * time.Second

// Message is one message of the dead-letter stream, decoded from the
// headers the bridge wrote (see docs/operating.md#dead-letters). Fields
// whose header is absent or unparsable are zero; Header always holds every
// header as stored. Every field is untrusted input: anyone allowed to
// publish on the dead-letter prefix can store a dead letter.
type Message struct {
	Seq            uint64    // sequence on the dead-letter stream
	Stream         string    // the dead-letter stream (set by Get and List)
	DLQSubject     string    // <prefix>.<route>.<original subject>
	Stored         time.Time // when the dead-letter stream stored it
	Route          string    // Bridge-Route
	Destination    string    // Bridge-Destination
	Reason         Reason    // Bridge-Reason: one of Reasons
	Failure        Failure   // Bridge-Failure: transport, downstream-status, ...
	Status         int       // Bridge-Status; 0 when no HTTP response was obtained
	Error          string    // Bridge-Error
	EventID        string    // Event-Id
	Subject        string    // Bridge-Original-Subject
	OriginalStream string    // Bridge-Original-Stream
	OriginalSeq    uint64    // Bridge-Original-Sequence
	Deliveries     uint64    // Bridge-Deliveries
	FailedAt       time.Time // Bridge-Failed-At
	Header         nats.Header
	// Data is the original payload; nil unless it was asked for
	// (List withData, Get).
	Data []byte
}

// Filter selects dead letters. Zero fields select everything.
type Filter struct {
	Route  string   // Bridge-Route; filtered server-side by subject
	Reason Reason   // Bridge-Reason
	Limit  int      // at most this many; 0 means no limit
	Seqs   []uint64 // only these sequences, in this order
}

// Match reports whether d passes the Route and Reason conditions of f.
func (f Filter) Match(d Message) bool {
	return (f.Route == "" || d.Route == f.Route) && (f.Reason == "" || d.Reason == f.Reason)
}

// Queue reads, replays and deletes the dead letters of one configuration's
// dead-letter stream. It never consumes them: listing uses an ephemeral
// ordered consumer that it deletes when done. It is safe for concurrent use.
// Make it with Open.
type Queue struct {
	js     jetstream.JetStream
	cfg    config.DeadLetter
	source string // stream.name: a replay counts only with a PubAck from it
	guard  guard  // which dead letters may be republished

	mu sync.Mutex
	s  jetstream.Stream // looked up on first use
}

// Open binds to the dead-letter stream of cfg (a validated
// configuration), with the replay guard of its stream, routes and
// dead-letter prefix. It does no I/O: the stream is looked up on first
// use, and a missing stream is an error matching
// jetstream.ErrStreamNotFound.
func Open(js jetstream.JetStream, cfg *config.Config) *Queue {
	return &Queue{js: js, cfg: cfg.DeadLetter, source: cfg.Stream.Name, guard: newGuard(cfg)}
}

// Stream is the name of the dead-letter stream.
func (q *Queue) Stream() string { return q.cfg.Stream }

func (q *Queue) stream(ctx context.Context) (jetstream.Stream, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.s != nil {
		return q.s, nil
	}
	s, err := q.js.Stream(ctx, q.cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("deadletter: dead-letter stream %s: %w", q.cfg.Stream, err)
	}
	q.s = s
	return s, nil
}

// List returns the dead letters that f selects, in stream order, without
// consuming or changing them. Payloads are left out unless withData.
//
// With f.Seqs it reads each sequence directly; a missing one is an error
// matching ErrNotFound. Otherwise it reads the stream through an
// ordered ephemeral consumer (headers only unless withData), filtered
// server-side by <subject_prefix>.<route>.> when f.Route is set, up to the
// last dead letter stored when List started, and deletes the consumer
// before returning.
func (q *Queue) List(ctx context.Context, f Filter, withData bool) ([]Message, error) {
	if f.Route != "" {
		if err := subjects.ValidateToken(f.Route); err != nil {
			return nil, fmt.Errorf("deadletter: route filter: %w", err)
		}
	}
	if f.Limit < 0 {
		return nil, fmt.Errorf("deadletter: negative limit %d", f.Limit)
	}
	if len(f.Seqs) > 0 {
		return q.listSeqs(ctx, f, withData)
	}
	s, err := q.stream(ctx)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("deadletter: dead-letter stream %s: %w", q.cfg.Stream, err)
	}
	if info.State.Msgs == 0 {
		return nil, nil
	}
	last := info.State.LastSeq

	occ := jetstream.OrderedConsumerConfig{
		HeadersOnly:       !withData,
		InactiveThreshold: listInactive,
	}
	if f.Route != "" {
		occ.FilterSubjects = []string{subjects.DeadLetter(q.cfg.SubjectPrefix, f.Route, ">")}
	}
	cons, err := s.OrderedConsumer(ctx, occ)
	if err != nil {
		return nil, fmt.Errorf("deadletter: read dead-letter stream %s: %w", q.cfg.Stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("deadletter: read dead-letter stream %s: %w", q.cfg.Stream, err)
	}
	defer func() {
		it.Stop()
		q.deleteConsumer(ctx, cons)
	}()
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		return nil, nil // nothing on the route
	}

	var out []Message
	for {
		nctx, cancel := context.WithTimeout(ctx, listWait)
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
			// Nothing arrived: finished unless the server still has some.
			ci, ierr := cons.Info(ctx)
			if ierr != nil {
				return nil, fmt.Errorf("deadletter: read dead-letter stream %s: %w", q.cfg.Stream, ierr)
			}
			if ci.NumPending == 0 {
				return out, nil
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("deadletter: read dead-letter stream %s: %w", q.cfg.Stream, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, fmt.Errorf("deadletter: read dead-letter stream %s: %w", q.cfg.Stream, err)
		}
		seq := md.Sequence.Stream
		if seq > last {
			return out, nil // stored after List started
		}
		h := m.Headers()
		delete(h, "Nats-Msg-Size") // added to headers-only deliveries
		d := decodeDeadLetter(seq, m.Subject(), md.Timestamp, h)
		d.Stream = q.cfg.Stream
		if withData {
			d.Data = m.Data()
		}
		if f.Match(d) {
			out = append(out, d)
			if f.Limit > 0 && len(out) >= f.Limit {
				return out, nil
			}
		}
		if md.NumPending == 0 || seq == last {
			return out, nil
		}
	}
}

// deleteConsumer removes List's ephemeral consumer right away rather than
// leaving it for the server's inactivity cleanup, also when ctx is done.
func (q *Queue) deleteConsumer(ctx context.Context, cons jetstream.Consumer) {
	ci := cons.CachedInfo()
	if ci == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	// A failure leaves the consumer to the inactivity threshold.
	_ = q.js.DeleteConsumer(ctx, q.cfg.Stream, ci.Name)
}

func (q *Queue) listSeqs(ctx context.Context, f Filter, withData bool) ([]Message, error) {
	var out []Message
	for _, seq := range f.Seqs {
		d, err := q.Get(ctx, seq)
		if err != nil {
			return nil, err
		}
		if !f.Match(d) {
			continue
		}
		if !withData {
			d.Data = nil
		}
		out = append(out, d)
		if f.Limit > 0 && len(out) >= f.Limit {
			break
		}
	}
	return out, nil
}

// Get reads one dead letter, payload included. A sequence that the stream
// does not hold is an error matching ErrNotFound.
func (q *Queue) Get(ctx context.Context, seq uint64) (Message, error) {
	s, err := q.stream(ctx)
	if err != nil {
		return Message{}, err
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return Message{}, q.notFound(seq)
		}
		return Message{}, fmt.Errorf("deadletter: dead letter %d on %s: %w", seq, q.cfg.Stream, err)
	}
	d := decodeDeadLetter(m.Sequence, m.Subject, m.Time, m.Header)
	d.Stream = q.cfg.Stream
	d.Data = m.Data
	if d.Data == nil {
		d.Data = []byte{}
	}
	return d, nil
}

func (q *Queue) notFound(seq uint64) error {
	return &kindError{msg: fmt.Sprintf("deadletter: dead letter %d not found on %s", seq, q.cfg.Stream), kind: ErrNotFound}
}

func notReplayable(seq uint64, why string) error {
	return &kindError{msg: fmt.Sprintf("deadletter: dead letter %d cannot be replayed: %s", seq, why), kind: ErrNotReplayable}
}

// Delete removes one dead letter. A sequence that the stream does not hold
// is an error matching ErrNotFound.
func (q *Queue) Delete(ctx context.Context, seq uint64) error {
	s, err := q.stream(ctx)
	if err != nil {
		return err
	}
	if err := s.DeleteMsg(ctx, seq); err != nil {
		// The delete error carries no code to branch on: ask whether the
		// message is still there.
		if _, gerr := s.GetMsg(ctx, seq); errors.Is(gerr, jetstream.ErrMsgNotFound) {
			return q.notFound(seq)
		}
		return fmt.Errorf("deadletter: delete dead letter %d on %s: %w", seq, q.cfg.Stream, err)
	}
	return nil
}

// decodeDeadLetter reads the dead-letter headers. It never fails: a
// dead letter written by something else still lists, with zero fields.
func decodeDeadLetter(seq uint64, subject string, stored time.Time, h nats.Header) Message {
	d := Message{
		Seq:            seq,
		DLQSubject:     subject,
		Stored:         stored,
		Route:          h.Get(HeaderRoute),
		Destination:    h.Get(HeaderDestination),
		Reason:         Reason(h.Get(HeaderReason)),
		Failure:        Failure(h.Get(HeaderFailure)),
		Error:          h.Get(HeaderError),
		EventID:        h.Get(producer.HeaderEventID),
		Subject:        h.Get(HeaderOriginalSubject),
		OriginalStream: h.Get(HeaderOriginalStream),
		Header:         h,
	}
	d.Status, _ = strconv.Atoi(h.Get(HeaderStatus))
	d.OriginalSeq, _ = strconv.ParseUint(h.Get(HeaderOriginalSequence), 10, 64)
	d.Deliveries, _ = strconv.ParseUint(h.Get(HeaderDeliveries), 10, 64)
	if t, err := time.Parse(time.RFC3339, h.Get(HeaderFailedAt)); err == nil {
		d.FailedAt = t
	}
	return d
}
