package bridge

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The safety net's negative controls, injected at a real seam: the
// jetstream.JetStream the bridge is given. advisoryJS hands Provision a
// wrapped consumer for the advisory stream, so the safety net reads
// advisories through it; everything else passes through unchanged.

// breakSafetyNet applies the safety-net faults f names to a built bridge
// (from faults.tweak, before Run provisions).
func (f faults) breakSafetyNet(b *Bridge) {
	if f.ignoreAdvisories {
		wrapAdvisoryConsumer(b, func(c jetstream.Consumer) jetstream.Consumer { return unreadAdvisories{c} })
	}
}

// retryPermanentAdvisories is the broken variant of the permanent-failure
// controls: every advisory the safety net gives up on is redelivered after
// 50 ms instead of being dropped (its DoubleAck becomes a NakWithDelay), as
// when every failure was retried, so it is counted and logged again and
// again and never leaves the advisory stream.
func retryPermanentAdvisories(b *Bridge) {
	wrapAdvisoryConsumer(b, func(c jetstream.Consumer) jetstream.Consumer {
		return settledAdvisories{Consumer: c, wrap: func(m jetstream.Msg) jetstream.Msg { return nakInsteadOfAck{m} }}
	})
}

// wrapAdvisoryConsumer makes b's advisory consumer, once Provision creates
// it, wrap(consumer).
func wrapAdvisoryConsumer(b *Bridge, wrap func(jetstream.Consumer) jetstream.Consumer) {
	b.js = advisoryJS{JetStream: b.js, stream: advisoryStreamName(b.cfg.DeadLetter), wrap: wrap}
}

// advisoryJS is a JetStream whose consumers on the advisory stream are
// wrapped.
type advisoryJS struct {
	jetstream.JetStream
	stream string
	wrap   func(jetstream.Consumer) jetstream.Consumer
}

func (j advisoryJS) CreateOrUpdateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := j.JetStream.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err == nil && stream == j.stream {
		c = j.wrap(c)
	}
	return c, err
}

// unreadAdvisories is a consumer whose fetches come back empty: the
// advisories they took are dropped unsettled, never handed to the safety
// net.
type unreadAdvisories struct{ jetstream.Consumer }

func (c unreadAdvisories) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	batch, err := c.Consumer.Fetch(n, opts...)
	if err != nil {
		return nil, err
	}
	for range batch.Messages() {
	}
	msgs := make(chan jetstream.Msg)
	close(msgs)
	return messageBatch{msgs: msgs, err: batch.Error}, nil
}

// settledAdvisories is a consumer whose fetched messages are wrap(m).
type settledAdvisories struct {
	jetstream.Consumer
	wrap func(jetstream.Msg) jetstream.Msg
}

func (c settledAdvisories) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	batch, err := c.Consumer.Fetch(n, opts...)
	if err != nil {
		return nil, err
	}
	msgs := make(chan jetstream.Msg)
	// Ends with the batch, which ends with the fetch's context.
	go func() {
		defer close(msgs)
		for m := range batch.Messages() {
			msgs <- c.wrap(m)
		}
	}()
	return messageBatch{msgs: msgs, err: batch.Error}, nil
}

// messageBatch is a jetstream.MessageBatch of msgs.
type messageBatch struct {
	msgs chan jetstream.Msg
	err  func() error
}

func (b messageBatch) Messages() <-chan jetstream.Msg { return b.msgs }
func (b messageBatch) Error() error                   { return b.err() }

// nakInsteadOfAck is a message whose DoubleAck asks for a redelivery.
type nakInsteadOfAck struct{ jetstream.Msg }

func (m nakInsteadOfAck) DoubleAck(context.Context) error {
	return m.NakWithDelay(50 * time.Millisecond)
}

// failingFetches is a consumer whose fetches all fail; it records when
// each was made.
type failingFetches struct {
	jetstream.Consumer
	mu sync.Mutex
	at []time.Time
}

func (c *failingFetches) Fetch(int, ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at = append(c.at, time.Now())
	return nil, errFetchRefused
}

var errFetchRefused = errors.New("fetch refused by the test")

// calls are the times of the fetches made so far.
func (c *failingFetches) calls() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.at)
}
