package bridge

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
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

// DLQMessage is one message of the dead-letter stream, decoded from the
// headers the bridge wrote (see the README's Dead letters section). Fields
// whose header is absent or unparsable are zero; Header always holds every
// header as stored. Every field is untrusted input: anyone allowed to
// publish on the dead-letter prefix can store a dead letter.
type DLQMessage struct {
	Seq            uint64             // sequence on the dead-letter stream
	Stream         string             // the dead-letter stream (set by Get and List)
	DLQSubject     string             // <prefix>.<route>.<original subject>
	Stored         time.Time          // when the dead-letter stream stored it
	Route          string             // Bridge-Route
	Destination    string             // Bridge-Destination
	Reason         deadletter.Reason  // Bridge-Reason: rejected, max-deliveries, invalid-event
	Failure        deadletter.Failure // Bridge-Failure: transport, downstream-status, ...
	Status         int                // Bridge-Status; 0 when no HTTP response was obtained
	Error          string             // Bridge-Error
	EventID        string             // Event-Id
	Subject        string             // Bridge-Original-Subject
	OriginalStream string             // Bridge-Original-Stream
	OriginalSeq    uint64             // Bridge-Original-Sequence
	Deliveries     uint64             // Bridge-Deliveries
	FailedAt       time.Time          // Bridge-Failed-At
	Header         nats.Header
	// Data is the original payload; nil unless it was asked for
	// (List withData, Get).
	Data []byte
}

// DLQFilter selects dead letters. Zero fields select everything.
type DLQFilter struct {
	Route  string            // Bridge-Route; filtered server-side by subject
	Reason deadletter.Reason // Bridge-Reason
	Limit  int               // at most this many; 0 means no limit
	Seqs   []uint64          // only these sequences, in this order
}

// Match reports whether d passes the Route and Reason conditions of f.
func (f DLQFilter) Match(d DLQMessage) bool {
	return (f.Route == "" || d.Route == f.Route) && (f.Reason == "" || d.Reason == f.Reason)
}

// ReplayResult is what one replay did.
type ReplayResult struct {
	Seq       uint64 // the dead letter's sequence on the dead-letter stream
	EventID   string
	Subject   string // the original subject it was republished to
	Stream    string // the stream that stored (or refused) the republished event
	StreamSeq uint64 // its sequence there (the stored original's for a duplicate)
	// Duplicate means JetStream refused the republished event as a
	// duplicate of an earlier replay of the same dead letter inside the
	// stream's duplicate window: nothing new was stored. The message
	// stored at StreamSeq was read back and is this dead letter's replay
	// (else Replay returns a *ReplayCollisionError).
	Duplicate bool
	Kept      bool // the dead letter was left on the dead-letter stream
}

// DLQ reads, replays and deletes the dead letters of one configuration's
// dead-letter stream. It never consumes them: listing uses an ephemeral
// ordered consumer that it deletes when done. It is safe for concurrent use.
// Make it with OpenDLQ: the zero value has no replay guard.
type DLQ struct {
	js     jetstream.JetStream
	cfg    config.DeadLetter
	source string // stream.name: a replay counts only with a PubAck from it

	// guard decides which dead letters may be republished; OpenDLQ sets it
	// to the replay guard of the configuration. Tests swap it for a
	// permissive one to show that their checks catch a missing guard.
	guard func(DLQMessage) error
	// pubOpts are the expectations of every replay's publish; OpenDLQ
	// sets them to WithExpectStream(stream.name).
	pubOpts []jetstream.PublishOpt
	// replayID is the Nats-Msg-Id of a dead letter's replay; OpenDLQ sets
	// it to ReplayMsgID. Tests swap in guessable schemes to show that
	// their checks catch one.
	replayID func(DLQMessage) string
	// readBack decides, after a duplicate PubAck, whether the message
	// stored at the acknowledged sequence is this replay; OpenDLQ sets it
	// to (*DLQ).storedReplay. Tests swap in one that trusts every
	// duplicate to show that their checks catch it.
	readBack func(ctx context.Context, want *nats.Msg, ack *jetstream.PubAck) (mismatch string, err error)

	mu sync.Mutex
	s  jetstream.Stream // looked up on first use
}

// OpenDLQ binds to the dead-letter stream of cfg (a validated
// configuration), with the replay guard of its stream, routes and
// dead-letter prefix. It does no I/O: the stream is looked up on first
// use, and a missing stream is an error matching
// jetstream.ErrStreamNotFound.
func OpenDLQ(js jetstream.JetStream, cfg *config.Config) *DLQ {
	q := &DLQ{
		js:       js,
		cfg:      cfg.DeadLetter,
		source:   cfg.Stream.Name,
		guard:    newReplayGuard(cfg).check,
		pubOpts:  []jetstream.PublishOpt{jetstream.WithExpectStream(cfg.Stream.Name)},
		replayID: ReplayMsgID,
	}
	q.readBack = q.storedReplay
	return q
}

// Stream is the name of the dead-letter stream.
func (q *DLQ) Stream() string { return q.cfg.Stream }

func (q *DLQ) stream(ctx context.Context) (jetstream.Stream, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.s != nil {
		return q.s, nil
	}
	s, err := q.js.Stream(ctx, q.cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("bridge: dead-letter stream %s: %w", q.cfg.Stream, err)
	}
	q.s = s
	return s, nil
}

// List returns the dead letters that f selects, in stream order, without
// consuming or changing them. Payloads are left out unless withData.
//
// With f.Seqs it reads each sequence directly; a missing one is an error
// matching ErrDeadLetterNotFound. Otherwise it reads the stream through an
// ordered ephemeral consumer (headers only unless withData), filtered
// server-side by <subject_prefix>.<route>.> when f.Route is set, up to the
// last dead letter stored when List started, and deletes the consumer
// before returning.
func (q *DLQ) List(ctx context.Context, f DLQFilter, withData bool) ([]DLQMessage, error) {
	if f.Route != "" {
		if err := subjects.ValidateToken(f.Route); err != nil {
			return nil, fmt.Errorf("bridge: route filter: %w", err)
		}
	}
	if f.Limit < 0 {
		return nil, fmt.Errorf("bridge: negative limit %d", f.Limit)
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
		return nil, fmt.Errorf("bridge: dead-letter stream %s: %w", q.cfg.Stream, err)
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
		return nil, fmt.Errorf("bridge: read dead-letter stream %s: %w", q.cfg.Stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("bridge: read dead-letter stream %s: %w", q.cfg.Stream, err)
	}
	defer func() {
		it.Stop()
		q.deleteConsumer(ctx, cons)
	}()
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		return nil, nil // nothing on the route
	}

	var out []DLQMessage
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
				return nil, fmt.Errorf("bridge: read dead-letter stream %s: %w", q.cfg.Stream, ierr)
			}
			if ci.NumPending == 0 {
				return out, nil
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("bridge: read dead-letter stream %s: %w", q.cfg.Stream, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, fmt.Errorf("bridge: read dead-letter stream %s: %w", q.cfg.Stream, err)
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
func (q *DLQ) deleteConsumer(ctx context.Context, cons jetstream.Consumer) {
	ci := cons.CachedInfo()
	if ci == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	// A failure leaves the consumer to the inactivity threshold.
	_ = q.js.DeleteConsumer(ctx, q.cfg.Stream, ci.Name)
}

func (q *DLQ) listSeqs(ctx context.Context, f DLQFilter, withData bool) ([]DLQMessage, error) {
	var out []DLQMessage
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
// does not hold is an error matching ErrDeadLetterNotFound.
func (q *DLQ) Get(ctx context.Context, seq uint64) (DLQMessage, error) {
	s, err := q.stream(ctx)
	if err != nil {
		return DLQMessage{}, err
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return DLQMessage{}, q.notFound(seq)
		}
		return DLQMessage{}, fmt.Errorf("bridge: dead letter %d on %s: %w", seq, q.cfg.Stream, err)
	}
	d := decodeDeadLetter(m.Sequence, m.Subject, m.Time, m.Header)
	d.Stream = q.cfg.Stream
	d.Data = m.Data
	if d.Data == nil {
		d.Data = []byte{}
	}
	return d, nil
}

func (q *DLQ) notFound(seq uint64) error {
	return &dlqError{msg: fmt.Sprintf("bridge: dead letter %d not found on %s", seq, q.cfg.Stream), kind: ErrDeadLetterNotFound}
}

func notReplayable(seq uint64, why string) error {
	return &dlqError{msg: fmt.Sprintf("bridge: dead letter %d cannot be replayed: %s", seq, why), kind: ErrNotReplayable}
}

// Delete removes one dead letter. A sequence that the stream does not hold
// is an error matching ErrDeadLetterNotFound.
func (q *DLQ) Delete(ctx context.Context, seq uint64) error {
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
		return fmt.Errorf("bridge: delete dead letter %d on %s: %w", seq, q.cfg.Stream, err)
	}
	return nil
}

// Replay republishes dead letter seq to its original subject (see the
// README's Dead letters and Security sections), waits for the PubAck of
// the configured stream and only then deletes the dead letter, unless
// keep.
//
// The republished event carries the original headers minus every Bridge-*
// and Nats-* header, with Event-Id unchanged, Nats-Msg-Id ReplayMsgID(d)
// (bound to the dead letter; no producer can compute it) and
// Bridge-Replayed-From "<seq>". Replaying the same dead letter again inside
// the source stream's duplicate window therefore stores nothing new
// (Duplicate is set), which makes a replay that was killed between the
// acknowledgement and the delete safe to run again.
//
// A duplicate PubAck is never taken on trust: the message stored at the
// acknowledged sequence is read back, and only when it is this dead
// letter's replay (same subject, Nats-Msg-Id, Event-Id, Bridge-Replayed-From
// and payload) does the replay count and the dead letter go. Otherwise
// Replay returns a *ReplayCollisionError (matching ErrReplayCollision),
// publishes nothing more and keeps the dead letter.
//
// Every dead letter passes the replay guard first (see CheckReplay): a
// refused one is an error matching ErrReplayRefused, nothing is published
// and the dead letter is kept. A dead letter missing a header that replay
// needs is an error matching ErrNotReplayable; one already gone matches
// ErrDeadLetterNotFound.
func (q *DLQ) Replay(ctx context.Context, seq uint64, keep bool) (ReplayResult, error) {
	d, err := q.Get(ctx, seq)
	if err != nil {
		return ReplayResult{}, err
	}
	res, err := q.republish(ctx, d)
	if err != nil || keep {
		res.Kept = err == nil
		return res, err
	}
	if err := q.Delete(ctx, seq); err != nil && !errors.Is(err, ErrDeadLetterNotFound) {
		// Republished but still on the DLQ: a new replay of it is a
		// duplicate, so running again finishes the job.
		return res, fmt.Errorf("bridge: dead letter %d republished as %s seq %d but not deleted: %w", seq, res.Stream, res.StreamSeq, err)
	}
	return res, nil
}

// CheckReplay reports whether Replay would republish d, without
// publishing anything: nil, or the refusal (matching ErrReplayRefused) or
// missing header (matching ErrNotReplayable) that stops it. It reads only
// d's headers, so d may come from List without data. A dead letter that
// passes can still be refused by JetStream when the PubAck would come
// from another stream than the configured one.
func (q *DLQ) CheckReplay(d DLQMessage) error {
	_, err := q.replayMsg(d)
	return err
}

// replayMsg is the only way from a dead letter to a republished message:
// the guard, then the header-derived construction.
func (q *DLQ) replayMsg(d DLQMessage) (*nats.Msg, error) {
	if err := q.guard(d); err != nil {
		return nil, err
	}
	id := q.replayID
	if id == nil {
		id = ReplayMsgID
	}
	return d.replayMsg(id(d))
}

// jsErrStreamNotMatch is JetStream's "expected stream does not match":
// the subject is stored by another stream than the one expected.
const jsErrStreamNotMatch jetstream.ErrorCode = 10060

// republish is the first half of Replay: guard, publish and wait for the
// PubAck of the configured stream.
func (q *DLQ) republish(ctx context.Context, d DLQMessage) (ReplayResult, error) {
	msg, err := q.replayMsg(d)
	if err != nil {
		return ReplayResult{Seq: d.Seq, EventID: d.EventID, Subject: d.Subject}, err
	}
	res := ReplayResult{Seq: d.Seq, EventID: d.EventID, Subject: msg.Subject}
	ack, err := q.js.PublishMsg(ctx, msg, q.pubOpts...)
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrStreamNotMatch:
		return res, &ReplayRefusedError{Seq: d.Seq, Subject: d.Subject, Err: err,
			Reason: fmt.Sprintf("%s is stored by another stream than %s; nothing was stored", deadletter.HeaderOriginalSubject, q.source)}
	case err != nil:
		if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
			err = producer.ErrNoStream
		}
		return res, fmt.Errorf("bridge: replay dead letter %d: %w", d.Seq, err)
	}
	res.Stream, res.StreamSeq, res.Duplicate = ack.Stream, ack.Sequence, ack.Duplicate
	if ack.Stream != q.source {
		// JetStream honours the expectation; never count another stream's
		// acknowledgement as a replay all the same.
		return res, &ReplayRefusedError{Seq: d.Seq, Subject: d.Subject,
			Reason: fmt.Sprintf("acknowledged by stream %s, not %s; the dead letter is kept", ack.Stream, q.source)}
	}
	if ack.Duplicate {
		// Nothing was stored: something else holds this id. It counts only
		// when it is this replay (an earlier run of it).
		mismatch, err := q.readBack(ctx, msg, ack)
		if err != nil {
			return res, fmt.Errorf("bridge: replay dead letter %d: duplicate of %s seq %d, which could not be read back (the dead letter is kept): %w",
				d.Seq, ack.Stream, ack.Sequence, err)
		}
		if mismatch != "" {
			return res, &ReplayCollisionError{Seq: d.Seq, Stream: ack.Stream, StreamSeq: ack.Sequence, Mismatch: mismatch}
		}
	}
	return res, nil
}

// ErrReplayCollision means a replay's PubAck was a duplicate of a message
// that is not this dead letter's replay: nothing was stored, and the dead
// letter is kept.
var ErrReplayCollision = errors.New("bridge: replay collision")

// ReplayCollisionError is a replay that JetStream answered as a duplicate
// of a message that, read back, is not this dead letter's replay: someone
// stored another message under the replay's Nats-Msg-Id. Nothing was
// stored and the dead letter is kept. It matches ErrReplayCollision.
type ReplayCollisionError struct {
	Seq       uint64 // the dead letter's sequence on the dead-letter stream
	Stream    string // the stream that answered
	StreamSeq uint64 // the sequence of the message it holds under the id
	// Mismatch names what differs (a header name or "payload"), never a
	// value.
	Mismatch string
}

func (e *ReplayCollisionError) Error() string {
	return fmt.Sprintf("bridge: dead letter %d kept: replay collision: %s seq %d holds another message under this replay's Nats-Msg-Id (%s); nothing was stored",
		e.Seq, e.Stream, e.StreamSeq, e.Mismatch)
}

func (e *ReplayCollisionError) Is(target error) bool { return target == ErrReplayCollision }

// storedReplay reads back the message that a duplicate PubAck names and
// says what makes it another message than want (names only), or "" when
// it is want as JetStream stores it. A message that is gone is a
// mismatch: nothing proves the replay was stored.
func (q *DLQ) storedReplay(ctx context.Context, want *nats.Msg, ack *jetstream.PubAck) (string, error) {
	m, err := readStored(ctx, q.js, ack.Stream, ack.Sequence)
	if err != nil {
		return "", err
	}
	if m == nil {
		return "it is gone, so it cannot be read back", nil
	}
	return replayMismatch(m.Subject, m.Header, m.Data, want), nil
}

// replayMismatch compares a stored message with the replay want: subject,
// Nats-Msg-Id, Event-Id, Bridge-Replayed-From and the payload's SHA-256.
// It returns what differs, or "".
func replayMismatch(subject string, h nats.Header, data []byte, want *nats.Msg) string {
	var diff []string
	if subject != want.Subject {
		diff = append(diff, "subject")
	}
	for _, k := range []string{jetstream.MsgIDHeader, producer.HeaderEventID, deadletter.HeaderReplayedFrom} {
		if !slices.Equal(h[k], want.Header[k]) {
			diff = append(diff, k)
		}
	}
	if sha256.Sum256(data) != sha256.Sum256(want.Data) {
		diff = append(diff, "payload")
	}
	if len(diff) == 0 {
		return ""
	}
	return "different " + strings.Join(diff, ", ")
}

// ReplayMsg is the message built from d's headers, as Replay publishes it
// once the replay guard let d through; an error (matching
// ErrNotReplayable) names the missing header. ReplayMsg itself applies no
// guard: use DLQ.CheckReplay or DLQ.Replay to decide whether d may be
// republished. The payload is d.Data, so d must come from Get or List
// withData for a real replay.
func (d DLQMessage) ReplayMsg() (*nats.Msg, error) {
	return d.replayMsg(ReplayMsgID(d))
}

func (d DLQMessage) replayMsg(id string) (*nats.Msg, error) {
	if d.Subject == "" {
		return nil, notReplayable(d.Seq, "no "+deadletter.HeaderOriginalSubject+" header")
	}
	if subjects.ValidateSubject(d.Subject) != nil {
		return nil, notReplayable(d.Seq, deadletter.HeaderOriginalSubject+" is not a valid subject")
	}
	if d.EventID == "" {
		return nil, notReplayable(d.Seq, "no "+producer.HeaderEventID+" header")
	}
	h := make(nats.Header, len(d.Header)+2)
	for k, vs := range d.Header {
		if replayDrops(k) {
			continue
		}
		h[k] = append([]string(nil), vs...)
	}
	seq := strconv.FormatUint(d.Seq, 10)
	h.Set(producer.HeaderEventID, d.EventID)
	h.Set(jetstream.MsgIDHeader, id)
	h.Set(deadletter.HeaderReplayedFrom, seq)
	return &nats.Msg{Subject: d.Subject, Header: h, Data: d.Data}, nil
}

// replayIDDomain starts what ReplayMsgID digests, so that no other digest
// of the same fields is ever the same id.
const replayIDDomain = "jetbridge replay v1"

// ReplayMsgID is the Nats-Msg-Id of the replay of dead letter d: "replay:"
// and 22 base64url characters (the first 128 bits) of the SHA-256 of the
// dead-letter stream's name, d's sequence there, the time that stream
// stored d (to the nanosecond) and the SHA-256 of d's payload. Two replays
// of one dead letter inside the source stream's duplicate window store one
// event. A producer cannot compute it: the stored time is known only to
// readers of the dead-letter stream, and the payload is bound in too, so it
// cannot make a replay a "duplicate" of a message of its own. d must come
// from Get (or List withData).
func ReplayMsgID(d DLQMessage) string {
	payload := sha256.Sum256(d.Data)
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%d\x00%d\x00", replayIDDomain, d.Stream, d.Seq, d.Stored.UnixNano())
	h.Write(payload[:])
	return "replay:" + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:16])
}

// replayDrops reports whether a dead letter's header stays behind on
// replay: the bridge's own, and every Nats-* header, in any case (the dead
// letter's broker dedup key, and expectations, rollups, TTLs, schedules or
// batches that a planted dead letter could carry).
func replayDrops(k string) bool {
	k = strings.ToLower(k)
	return strings.HasPrefix(k, "bridge-") || strings.HasPrefix(k, "nats-")
}

// decodeDeadLetter reads the dead-letter headers. It never fails: a
// dead letter written by something else still lists, with zero fields.
func decodeDeadLetter(seq uint64, subject string, stored time.Time, h nats.Header) DLQMessage {
	d := DLQMessage{
		Seq:            seq,
		DLQSubject:     subject,
		Stored:         stored,
		Route:          h.Get(deadletter.HeaderRoute),
		Destination:    h.Get(deadletter.HeaderDestination),
		Reason:         deadletter.Reason(h.Get(deadletter.HeaderReason)),
		Failure:        deadletter.Failure(h.Get(deadletter.HeaderFailure)),
		Error:          h.Get(deadletter.HeaderError),
		EventID:        h.Get(producer.HeaderEventID),
		Subject:        h.Get(deadletter.HeaderOriginalSubject),
		OriginalStream: h.Get(deadletter.HeaderOriginalStream),
		Header:         h,
	}
	d.Status, _ = strconv.Atoi(h.Get(deadletter.HeaderStatus))
	d.OriginalSeq, _ = strconv.ParseUint(h.Get(deadletter.HeaderOriginalSequence), 10, 64)
	d.Deliveries, _ = strconv.ParseUint(h.Get(deadletter.HeaderDeliveries), 10, 64)
	if t, err := time.Parse(time.RFC3339, h.Get(deadletter.HeaderFailedAt)); err == nil {
		d.FailedAt = t
	}
	return d
}
