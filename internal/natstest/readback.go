package natstest

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ReadBack wraps js so that a message read back from stream (GetMsg, as
// after a duplicate PubAck) is what alter returns, given the stored message
// and the last message published through the wrapper. Reads of other
// streams are left alone. Tests use it to show that a read-back check goes
// red when what is read back is trusted, or altered.
func ReadBack(js jetstream.JetStream, stream string, alter func(stored *jetstream.RawStreamMsg, sent *nats.Msg) *jetstream.RawStreamMsg) jetstream.JetStream {
	return readBackJS{JetStream: js, stream: stream, alter: alter, last: &lastSent{}}
}

type lastSent struct {
	mu  sync.Mutex
	msg *nats.Msg
}

type readBackJS struct {
	jetstream.JetStream
	stream string
	alter  func(stored *jetstream.RawStreamMsg, sent *nats.Msg) *jetstream.RawStreamMsg
	last   *lastSent
}

func (j readBackJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	j.last.mu.Lock()
	j.last.msg = m
	j.last.mu.Unlock()
	return j.JetStream.PublishMsg(ctx, m, opts...)
}

func (j readBackJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	s, err := j.JetStream.Stream(ctx, name)
	if err != nil || name != j.stream {
		return s, err
	}
	return readBackStream{Stream: s, js: j}, nil
}

type readBackStream struct {
	jetstream.Stream
	js readBackJS
}

func (s readBackStream) GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	m, err := s.Stream.GetMsg(ctx, seq, opts...)
	if err != nil {
		return m, err
	}
	s.js.last.mu.Lock()
	sent := s.js.last.msg
	s.js.last.mu.Unlock()
	return s.js.alter(m, sent), nil
}
