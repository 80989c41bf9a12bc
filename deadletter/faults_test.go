package deadletter_test

import (
	"context"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
)

// Broken replays for the negative controls, injected through the
// JetStream a Queue is opened on (a real seam: deadletter.Open takes any
// jetstream.JetStream). Each wraps a working one and changes what a
// publish sends or what a stream read returns.

// jsVariant wraps the JetStream a Queue of cfg is opened on; nil is the
// real one.
type jsVariant func(js jetstream.JetStream, cfg *config.Config) jetstream.JetStream

func (v jsVariant) open(js jetstream.JetStream, cfg *config.Config) *deadletter.Queue {
	if v != nil {
		js = v(js, cfg)
	}
	return deadletter.Open(js, cfg)
}

// replayVariant is how a test replays one dead letter: the zero value is
// Queue.Replay (without keep) on the real JetStream.
type replayVariant struct {
	js     jsVariant
	replay func(ctx context.Context, q *deadletter.Queue, seq uint64) (deadletter.ReplayResult, error)
}

func (v replayVariant) run(ctx context.Context, q *deadletter.Queue, seq uint64) (deadletter.ReplayResult, error) {
	if v.replay != nil {
		return v.replay(ctx, q, seq)
	}
	return q.Replay(ctx, seq, false)
}

// unguarded replays without the replay guard (Queue.ReplayWithoutGuard,
// export_test.go).
func unguarded(ctx context.Context, q *deadletter.Queue, seq uint64) (deadletter.ReplayResult, error) {
	return q.ReplayWithoutGuard(ctx, seq)
}

// noExpect opens the Queue on noExpectJS.
func noExpect(js jetstream.JetStream, _ *config.Config) jetstream.JetStream { return noExpectJS{js} }

// noExpectJS publishes without the options the Queue passes: a replay
// without its stream expectation.
type noExpectJS struct{ jetstream.JetStream }

func (j noExpectJS) PublishMsg(ctx context.Context, m *nats.Msg, _ ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return j.JetStream.PublishMsg(ctx, m)
}

// replayIDJS publishes every replay (a message with Bridge-Replayed-From)
// under the Nats-Msg-Id that id computes from the dead letter it replays
// (its stream, sequence and event id) instead of the Queue's.
type replayIDJS struct {
	jetstream.JetStream
	dlq string // the dead-letter stream
	id  func(d deadletter.Message) string
}

func (j replayIDJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	from := m.Header.Get(deadletter.HeaderReplayedFrom)
	if from == "" {
		return j.JetStream.PublishMsg(ctx, m, opts...)
	}
	seq, _ := strconv.ParseUint(from, 10, 64)
	h := nats.Header{}
	for k, vs := range m.Header {
		h[k] = slices.Clone(vs)
	}
	h.Set(jetstream.MsgIDHeader, j.id(deadletter.Message{Stream: j.dlq, Seq: seq, EventID: m.Header.Get("Event-Id")}))
	return j.JetStream.PublishMsg(ctx, &nats.Msg{Subject: m.Subject, Header: h, Data: m.Data}, opts...)
}

// oldReplayID is the guessable scheme before: "<event id>:replay:<seq>".
func oldReplayID(js jetstream.JetStream, cfg *config.Config) jetstream.JetStream {
	return replayIDJS{JetStream: js, dlq: cfg.DeadLetter.Stream, id: func(d deadletter.Message) string {
		return d.EventID + ":replay:" + strconv.FormatUint(d.Seq, 10)
	}}
}

// unboundReplayID is a digest of the dead-letter stream and sequence
// only: not bound to the payload or the stored time.
func unboundReplayID(js jetstream.JetStream, cfg *config.Config) jetstream.JetStream {
	return replayIDJS{JetStream: js, dlq: cfg.DeadLetter.Stream, id: func(d deadletter.Message) string {
		return deadletter.ReplayMsgID(deadletter.Message{Stream: d.Stream, Seq: d.Seq})
	}}
}

// trustDuplicates takes a duplicate PubAck as success, as the code before
// the read-back did: what is read back is what was sent.
func trustDuplicates(js jetstream.JetStream, cfg *config.Config) jetstream.JetStream {
	return natstest.ReadBack(js, cfg.Stream.Name, func(stored *jetstream.RawStreamMsg, sent *nats.Msg) *jetstream.RawStreamMsg {
		return &jetstream.RawStreamMsg{Subject: sent.Subject, Sequence: stored.Sequence, Header: sent.Header, Data: sent.Data, Time: stored.Time}
	})
}

// distrustDuplicates calls every duplicate a collision: what is read back
// differs from what was sent by its payload.
func distrustDuplicates(js jetstream.JetStream, cfg *config.Config) jetstream.JetStream {
	return natstest.ReadBack(js, cfg.Stream.Name, func(stored *jetstream.RawStreamMsg, _ *nats.Msg) *jetstream.RawStreamMsg {
		c := *stored
		c.Data = append(slices.Clone(stored.Data), '!')
		return &c
	})
}
