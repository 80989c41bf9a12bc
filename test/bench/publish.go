package main

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	streamName = "EVENTS"
	subject    = "events.info.bench"
)

// stallWait bounds how long an async publish waits for a free slot.
const stallWait = 30 * time.Second

// publisher publishes the benchmark's messages on a connection of its own.
type publisher struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	failed atomic.Int64 // async publishes that got no PubAck
}

func newPublisher(ctx context.Context, natsURL string) (*publisher, error) {
	p := &publisher{}
	nc, err := nats.Connect(natsURL, nats.Name("bench-publisher"))
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) {
		p.failed.Add(1)
	}), jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		nc.Close()
		return nil, err
	}
	p.nc, p.js = nc, js
	// The stream exactly as the bridge would create it
	// (docs/configuration.md defaults), so the bridge finds it matching and
	// leaves it alone; the naive bridge just uses it.
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       streamName,
		Subjects:   []string{"events.>"},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Duplicates: 2 * time.Minute,
		MaxAge:     168 * time.Hour,
		Replicas:   1,
	})
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("create stream: %w", err)
	}
	return p, nil
}

func (p *publisher) close() { p.nc.Close() }

// subjectOf is the subject of message seq published over keys keys: the
// one subject when keys is 0, else events.info.k<seq mod keys>, round-robin
// so that the keys interleave (the ordered scenarios key on the third
// token: issue28.go).
func subjectOf(seq, keys int) string {
	if keys <= 0 {
		return subject
	}
	return keyedPrefix + strconv.Itoa(seq%keys)
}

// keyedPrefix is the subject of a keyed message less its key.
const keyedPrefix = "events.info.k"

// publish sends message seq asynchronously, timestamped now, on the
// subject of subjectOf(seq, keys).
func (p *publisher) publish(seq, keys int) error {
	m := &nats.Msg{Subject: subjectOf(seq, keys), Header: nats.Header{}, Data: payload(seq, time.Now().UnixNano())}
	m.Header.Set(jetstream.MsgIDHeader, "m-"+strconv.Itoa(seq))
	m.Header.Set("Content-Type", "application/json")
	// With 4096 PubAcks pending a publish waits for room; on a loaded
	// machine the server may take longer than the default 200 ms to ack.
	_, err := p.js.PublishMsgAsync(m, jetstream.WithStallWait(stallWait))
	return err
}

// wait waits until every async publish has its PubAck and checks that the
// stream holds want messages.
func (p *publisher) wait(ctx context.Context, want int, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.js.PublishAsyncComplete():
	case <-timer.C:
		return fmt.Errorf("publish: %d PubAcks still pending after %s", p.js.PublishAsyncPending(), timeout)
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	if n := p.failed.Load(); n > 0 {
		return fmt.Errorf("publish: %d messages got no PubAck", n)
	}
	s, err := p.js.Stream(ctx, streamName)
	if err != nil {
		return err
	}
	if got := s.CachedInfo().State.Msgs; got != uint64(want) {
		return fmt.Errorf("publish: stream holds %d messages, want %d", got, want)
	}
	return nil
}

// prepublish publishes messages 0..n-1 as fast as JetStream takes them,
// over keys subjects (subjectOf).
func (p *publisher) prepublish(ctx context.Context, n, keys int) error {
	for seq := range n {
		if err := p.publish(seq, keys); err != nil {
			return fmt.Errorf("publish %d: %w", seq, err)
		}
		if seq%4096 == 0 && ctx.Err() != nil {
			return context.Cause(ctx)
		}
	}
	return p.wait(ctx, n, time.Minute+time.Duration(n)*time.Millisecond)
}

// paced publishes messages from..from+count-1 at rate per second, each on
// its schedule (a late one is sent at once, never skipped).
func (p *publisher) paced(ctx context.Context, from, count, rate int) error {
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i := range count {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		if err := p.publish(from+i, 0); err != nil {
			return fmt.Errorf("publish %d: %w", from+i, err)
		}
	}
	return p.wait(ctx, from+count, time.Minute)
}
