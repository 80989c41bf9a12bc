package bridge

import (
	"context"
	"errors"
	"math"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
)

// The broken variants of the delivery core's negative controls, injected
// into a built bridge (breakCore, from faults.tweak) through the seams a
// bridge has anyway:
//
//   - the JetStream it is given (an interface): a wrapped one hands out
//     consumers whose messages break their settlement or progress acks
//     (beforeAck, noProgress, progressAfterSettle, headerWins), and an
//     idempotency bucket that breaks the store's atomic create, its
//     release, or the records it reads back (reserveCreate,
//     keepReservationOnFailure, noTakeover, contentBlind);
//   - the route's settlement rules (settleRules) and policy (noHold,
//     termWithoutDeadLetter, maxDeliverOffByOne);
//   - the pull loop's configuration (noOverlap, alwaysPullHeartbeat).

// breakCore applies the delivery core's faults f to a built bridge.
func (f faults) breakCore(b *Bridge) {
	if w := f.jetStream(b.js); w != nil {
		b.js = w
	}
	for _, r := range b.routes {
		if f.maxDeliverOffByOne {
			r.policy.MaxDeliver++
			r.rules = r.policy
		}
		if f.noHold || f.termWithoutDeadLetter {
			r.rules = brokenRules{p: r.policy, noHold: f.noHold, termWithoutDeadLetter: f.termWithoutDeadLetter}
		}
		if f.noOverlap {
			// More free slots than the route has: the next pull waits for
			// the open one to end.
			r.puller.cfg.overlap = cap(r.load.slots) + 1
		}
		if f.alwaysPullHeartbeat {
			r.puller.cfg.afterFull = r.puller.cfg.afterShort
		}
	}
}

// brokenRules is the settlement table with a deliberately broken row.
type brokenRules struct {
	p                     settlePolicy
	noHold                bool // an open breaker's refusal is redelivered, spending the budget
	termWithoutDeadLetter bool // a dead letter that was not stored still terminates the message
}

func (br brokenRules) decide(err error, delivered uint64) decision {
	if br.termWithoutDeadLetter {
		var dle *DeadLetterError
		if errors.As(err, &dle) {
			return decision{action: actDeadLetter, reason: dle.Reason}
		}
	}
	d := br.p.decide(err, delivered)
	if br.noHold && d.action == actHold {
		return redeliver(delivered, br.p, 0)
	}
	return d
}

// jetStream is js wrapped with the message and bucket faults of f, or nil
// when f has none.
func (f faults) jetStream(js jetstream.JetStream) jetstream.JetStream {
	mf := msgFaults{beforeAck: f.beforeAck, noProgress: f.noProgress}
	if f.progressAfterSettle {
		mf.lateProgress = js
	}
	kf := kvFaults{keepOnDelete: f.keepReservationOnFailure, noTakeover: f.noTakeover, contentBlind: f.contentBlind, create: f.reserveCreate}
	w := faultyJS{JetStream: js}
	if mf.beforeAck != nil || mf.noProgress || mf.lateProgress != nil {
		w.msg = func(m jetstream.Msg) jetstream.Msg { return faultyMsg{Msg: m, f: mf} }
	}
	if kf.any() {
		w.kv = kf.wrap
	}
	if w.msg == nil && w.kv == nil {
		return nil
	}
	return w
}

// headerWins gives a bridge the Event-Severity precedence it had before
// the subject decided: a valid header overrides the subject's severity
// token, and is never counted as a mismatch. The negative controls of
// severity_test.go inject it as a tweak: the bridge's messages carry the
// header's severity in their subject's token.
func headerWins(b *Bridge) {
	b.js = faultyJS{JetStream: b.js, msg: func(m jetstream.Msg) jetstream.Msg { return headerWinsMsg{m} }}
}

type headerWinsMsg struct{ jetstream.Msg }

func (m headerWinsMsg) Subject() string {
	subj := m.Msg.Subject()
	sev, err := subjects.ParseSeverity(m.Headers().Get(producer.HeaderEventSeverity))
	tok := strings.SplitN(subj, ".", 3)
	if err != nil || len(tok) != 3 {
		return subj
	}
	if _, err := subjects.ParseSeverity(tok[1]); err != nil {
		return subj
	}
	return tok[0] + "." + sev.Token() + "." + tok[2]
}

// faultyJS is a JetStream whose consumers hand out messages through msg
// and whose buckets are wrapped by kv (either nil: as they are).
type faultyJS struct {
	jetstream.JetStream
	msg func(jetstream.Msg) jetstream.Msg
	kv  func(jetstream.KeyValue) jetstream.KeyValue
}

func (j faultyJS) consumer(c jetstream.Consumer, err error) (jetstream.Consumer, error) {
	if err != nil || j.msg == nil {
		return c, err
	}
	return faultyConsumer{Consumer: c, msg: j.msg}, nil
}

func (j faultyJS) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	return j.consumer(j.JetStream.Consumer(ctx, stream, name))
}

func (j faultyJS) CreateOrUpdateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	return j.consumer(j.JetStream.CreateOrUpdateConsumer(ctx, stream, cfg))
}

func (j faultyJS) bucket(kv jetstream.KeyValue, err error) (jetstream.KeyValue, error) {
	if err != nil || j.kv == nil {
		return kv, err
	}
	return j.kv(kv), nil
}

func (j faultyJS) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	return j.bucket(j.JetStream.KeyValue(ctx, bucket))
}

func (j faultyJS) CreateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	return j.bucket(j.JetStream.CreateKeyValue(ctx, cfg))
}

func (j faultyJS) CreateOrUpdateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	return j.bucket(j.JetStream.CreateOrUpdateKeyValue(ctx, cfg))
}

func (j faultyJS) UpdateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	return j.bucket(j.JetStream.UpdateKeyValue(ctx, cfg))
}

// faultyConsumer's pulls hand out their messages through msg.
type faultyConsumer struct {
	jetstream.Consumer
	msg func(jetstream.Msg) jetstream.Msg
}

func (c faultyConsumer) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	b, err := c.Consumer.Fetch(n, opts...)
	if err != nil {
		return b, err
	}
	out := make(chan jetstream.Msg, n)
	go func() { // ends with the pull
		defer close(out)
		for m := range b.Messages() {
			out <- c.msg(m)
		}
	}()
	return faultyBatch{MessageBatch: b, msgs: out}, nil
}

type faultyBatch struct {
	jetstream.MessageBatch
	msgs chan jetstream.Msg
}

func (b faultyBatch) Messages() <-chan jetstream.Msg { return b.msgs }

// msgFaults break a message's settlement or progress acks.
type msgFaults struct {
	beforeAck    func()              // runs before the ack (a hook: tests lose the ack there), when the bridge reads where to send it
	noProgress   bool                // InProgress sends nothing
	lateProgress jetstream.JetStream // non-nil: a progress ack goes out just after the settlement
}

type faultyMsg struct {
	jetstream.Msg
	f msgFaults
}

func (m faultyMsg) ack() {
	if m.f.beforeAck != nil {
		m.f.beforeAck()
	}
}

// settled sends, when asked, one more progress ack just after the
// settlement: what the race does (nats.go checks that the message is not
// settled, the settlement goes out, then the progress ack).
func (m faultyMsg) settled(err error) error {
	if js := m.f.lateProgress; js != nil {
		reply := m.Msg.Reply()
		time.AfterFunc(5*time.Millisecond, func() { _ = js.Conn().Publish(reply, []byte("+WPI")) })
	}
	return err
}

// Reply is where the bridge sends the ack of a 2xx (acks.go): asked for
// it, the message runs the hook before the ack goes out. nats.go's own
// settlements (Ack, DoubleAck, below) read the reply subject inside the
// library, not through this method.
func (m faultyMsg) Reply() string { m.ack(); return m.Msg.Reply() }

func (m faultyMsg) Ack() error { m.ack(); return m.settled(m.Msg.Ack()) }
func (m faultyMsg) DoubleAck(ctx context.Context) error {
	m.ack()
	return m.settled(m.Msg.DoubleAck(ctx))
}
func (m faultyMsg) Nak() error { return m.settled(m.Msg.Nak()) }
func (m faultyMsg) NakWithDelay(d time.Duration) error {
	return m.settled(m.Msg.NakWithDelay(d))
}
func (m faultyMsg) Term() error { return m.settled(m.Msg.Term()) }
func (m faultyMsg) TermWithReason(reason string) error {
	return m.settled(m.Msg.TermWithReason(reason))
}
func (m faultyMsg) InProgress() error {
	if m.f.noProgress {
		return nil
	}
	return m.Msg.InProgress()
}

// kvFaults break the idempotency bucket under the reservation store.
type kvFaults struct {
	// create replaces the atomic create (a racy check-then-act store).
	create func(kv jetstream.KeyValue) func(ctx context.Context, key string, value []byte) (uint64, error)
	// keepOnDelete: a release deletes nothing (a failed delivery leaves
	// its reservation behind).
	keepOnDelete bool
	// noTakeover: every in-flight reservation reads as fresh and held by a
	// later delivery, so none is ever taken over.
	noTakeover bool
	// contentBlind: every reservation reads as a previous release's record,
	// without its subject and payload digest (the event id alone decides).
	contentBlind bool
}

func (f kvFaults) any() bool {
	return f.create != nil || f.keepOnDelete || f.noTakeover || f.contentBlind
}

func (f kvFaults) wrap(kv jetstream.KeyValue) jetstream.KeyValue { return faultyKV{KeyValue: kv, f: f} }

type faultyKV struct {
	jetstream.KeyValue
	f kvFaults
}

func (kv faultyKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if kv.f.create != nil {
		return kv.f.create(kv.KeyValue)(ctx, key, value)
	}
	return kv.KeyValue.Create(ctx, key, value, opts...)
}

func (kv faultyKV) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	if kv.f.keepOnDelete {
		return nil
	}
	return kv.KeyValue.Delete(ctx, key, opts...)
}

func (kv faultyKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	e, err := kv.KeyValue.Get(ctx, key)
	if err != nil || !(kv.f.noTakeover || kv.f.contentBlind) {
		return e, err
	}
	h, perr := parseHolder(e.Value())
	if perr != nil {
		return e, err
	}
	out := rewrittenEntry{KeyValueEntry: e, created: e.Created()}
	if kv.f.contentBlind {
		h.subject, h.digest = "", ""
	}
	if kv.f.noTakeover && h.state == stateInFlight {
		h.delivered, out.created = math.MaxUint64, time.Now()
	}
	out.value = h.encode()
	return out, nil
}

// rewrittenEntry is a bucket entry read back with another value and
// creation time.
type rewrittenEntry struct {
	jetstream.KeyValueEntry
	value   []byte
	created time.Time
}

func (e rewrittenEntry) Value() []byte      { return e.value }
func (e rewrittenEntry) Created() time.Time { return e.created }
