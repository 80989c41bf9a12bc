package main

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// asyncAcker is the floor's confirmed ack collected the way the bridge
// collects its own (bridge/acks.go), as lean as it can be written: goroutine
// i publishes its ack ("+ACK", what Msg.Ack sends) with the reply subject
// PREFIX.i.GEN on one wildcard subscription and takes its next message; it
// waits only while its previous ack is still unconfirmed (at most K acks
// await confirmation, as in the bridge). One sweep every ackSweep sends
// again an ack unanswered for ackAgain, ackSends sends in all. It measures
// what that confirmation costs a minimal bridge, so that the floor moves
// with the cheaper confirmation (issue 26).
type asyncAcker struct {
	nc     *nats.Conn
	prefix string
	slots  []ackSlot
}

const (
	ackSweep = 100 * time.Millisecond
	ackAgain = 2 * time.Second
	ackSends = 3
)

// ackSlot is goroutine i's ack awaiting its confirmation.
type ackSlot struct {
	mu      sync.Mutex
	subject string // the message's ack subject; "" once confirmed or given up
	gen     uint64
	sent    time.Time
	sends   int
	room    chan struct{} // holds a token while the slot is free
}

var ackBody = []byte("+ACK")

func newAsyncAcker(ctx context.Context, nc *nats.Conn, k int) (*asyncAcker, error) {
	a := &asyncAcker{nc: nc, prefix: nc.NewInbox() + ".", slots: make([]ackSlot, k)}
	for i := range a.slots {
		a.slots[i].room = make(chan struct{}, 1)
		a.slots[i].room <- struct{}{}
	}
	sub, err := nc.Subscribe(a.prefix+"*.*", a.confirmed)
	if err != nil {
		return nil, err
	}
	go func() {
		t := time.NewTicker(ackSweep)
		defer t.Stop()
		defer sub.Unsubscribe()
		for {
			select {
			case now := <-t.C:
				a.sweep(now)
			case <-ctx.Done():
				return
			}
		}
	}()
	return a, nil
}

// ack sends goroutine i's ack of m once its previous one is confirmed.
func (a *asyncAcker) ack(ctx context.Context, i int, m jetstream.Msg) {
	s := &a.slots[i]
	select {
	case <-s.room:
	case <-ctx.Done():
		return
	}
	s.mu.Lock()
	s.gen++
	s.subject, s.sent, s.sends = m.Reply(), time.Now(), 1
	gen := s.gen
	s.mu.Unlock()
	_ = a.nc.PublishRequest(m.Reply(), a.prefix+strconv.Itoa(i)+"."+strconv.FormatUint(gen, 10), ackBody)
}

// confirmed frees the slot whose current ack the reply answers.
func (a *asyncAcker) confirmed(msg *nats.Msg) {
	is, gens, ok := strings.Cut(strings.TrimPrefix(msg.Subject, a.prefix), ".")
	i, err1 := strconv.Atoi(is)
	gen, err2 := strconv.ParseUint(gens, 10, 64)
	if !ok || err1 != nil || err2 != nil || i < 0 || i >= len(a.slots) {
		return
	}
	s := &a.slots[i]
	s.mu.Lock()
	mine := s.subject != "" && s.gen == gen
	if mine {
		s.subject = ""
	}
	s.mu.Unlock()
	if mine {
		s.room <- struct{}{}
	}
}

// sweep sends again the acks unanswered for ackAgain, and gives up on
// those sent ackSends times.
func (a *asyncAcker) sweep(now time.Time) {
	for i := range a.slots {
		s := &a.slots[i]
		s.mu.Lock()
		if s.subject == "" || now.Sub(s.sent) < ackAgain {
			s.mu.Unlock()
			continue
		}
		if s.sends == ackSends {
			s.subject = ""
			s.mu.Unlock()
			s.room <- struct{}{}
			continue
		}
		s.sends++
		s.sent = now
		subject, gen := s.subject, s.gen
		s.mu.Unlock()
		_ = a.nc.PublishRequest(subject, a.prefix+strconv.Itoa(i)+"."+strconv.FormatUint(gen, 10), ackBody)
	}
}
