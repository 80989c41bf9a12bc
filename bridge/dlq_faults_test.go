package bridge

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
)

// Broken dead-letter stores for the negative controls, injected through
// the JetStream the bridge publishes its dead letters on (a real seam:
// bridge.New takes any jetstream.JetStream). Each wraps the bridge's own
// after New, from a tweak: b.js = ....

// unshrunkJS stores every dead letter whole, as before payload omission
// existed: a reduced form (Bridge-Payload-Omitted) is published with the
// original payload and headers put back, read from the source stream at
// Bridge-Original-Sequence, so the server and the client refuse it as
// they refuse the full form.
type unshrunkJS struct{ jetstream.JetStream }

func (j unshrunkJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if _, ok := m.Header[deadletter.HeaderPayloadOmitted]; !ok {
		return j.JetStream.PublishMsg(ctx, m, opts...)
	}
	seq, _ := strconv.ParseUint(m.Header.Get(deadletter.HeaderOriginalSequence), 10, 64)
	orig, err := readStored(ctx, j.JetStream, m.Header.Get(deadletter.HeaderOriginalStream), seq)
	if err != nil || orig == nil {
		return nil, fmt.Errorf("unshrunkJS: original of the dead letter: %v", err)
	}
	h := nats.Header{}
	for k, vs := range m.Header {
		if k != deadletter.HeaderPayloadOmitted && k != deadletter.HeaderHeadersOmitted {
			h[k] = slices.Clone(vs)
		}
	}
	for k, vs := range orig.Header {
		if _, ok := h[k]; !ok && !ownHeader(k) {
			h[k] = slices.Clone(vs)
		}
	}
	return j.JetStream.PublishMsg(ctx, &nats.Msg{Subject: m.Subject, Header: h, Data: orig.Data}, opts...)
}

// trustDeadLetterDuplicates takes every duplicate PubAck as this dead
// letter, as before the read-back: what is read back is what was sent.
func trustDeadLetterDuplicates(b *Bridge) {
	b.js = natstest.ReadBack(b.js, b.cfg.DeadLetter.Stream, func(stored *jetstream.RawStreamMsg, sent *nats.Msg) *jetstream.RawStreamMsg {
		return &jetstream.RawStreamMsg{Subject: sent.Subject, Sequence: stored.Sequence, Header: sent.Header, Data: sent.Data, Time: stored.Time}
	})
}

// distrustDeadLetterDuplicates calls every duplicate another message:
// what is read back differs from what was sent by its payload.
func distrustDeadLetterDuplicates(b *Bridge) {
	b.js = natstest.ReadBack(b.js, b.cfg.DeadLetter.Stream, func(stored *jetstream.RawStreamMsg, _ *nats.Msg) *jetstream.RawStreamMsg {
		c := *stored
		c.Data = append(slices.Clone(stored.Data), '!')
		return &c
	})
}

// noShrink stores every dead letter whole (see unshrunkJS).
func noShrink(b *Bridge) { b.js = unshrunkJS{b.js} }
