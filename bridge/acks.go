package bridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A route's confirmed acks, sent without holding the worker. After a 2xx
// (or a duplicate) the worker publishes the ack ("+ACK", what
// jetstream.Msg.Ack sends) to the message's reply subject with a reply
// subject of the route's own: one subscription per route collects the
// confirmations JetStream sends there (what DoubleAck waits for, one
// request and one response channel per ack). The worker gives its slot
// back at once and takes the next message; the route's completer matches
// each confirmation to its ack, sends again an ack that got none within
// ackTimeout (or that was refused: no responders), at most ackTries sends
// ackRetryPause or more apart, on one sweep over the pending acks (no
// timer per ack), exactly as ackMsg does on the worker.
//
// A settlement by ack is reported (the "settled" log line, metrics,
// OnSettle, the end of the delivery's span) when it is confirmed, or when
// the last send went unconfirmed, with the "settlement not confirmed"
// warning: never before JetStream confirmed it, as before.
//
// At most max_in_flight acks of a route await confirmation: a worker
// whose ack would be one more waits for a place, as it waited for the
// confirmation before. A freed slot lets the route pull a message that a
// worker takes at once; an acked message is no longer the bridge's to work
// on. The completer runs from Run's start until every worker has settled
// what it held; then it finishes its pending acks (confirmed, or given up
// after the last send, within ackTries × ackTimeout as on the worker
// before) before Run returns.

// With idempotency, the reservation's done record must be stored before
// the ack goes out (so that a lost ack is recognised on redelivery). The
// worker no longer waits for it either: it hands the record to the
// completer with the ack, the completer publishes the record (a KV Update:
// the bucket's subject of the key, accepted only while the key's last
// revision is the lease's) with a reply subject of its own, and sends the
// ack once JetStream has answered. A refused or unanswered record is what a
// failed done was on the worker: counted, the "delivered, but not recorded
// as done" warning, and the ack sent all the same; "no responders" is tried
// again like an ack, at most ackTries sends.

// ackConfig is how a route's completer treats an unconfirmed ack or done
// record.
type ackConfig struct {
	timeout    time.Duration // wait for an ack's confirmation before sending it again
	tries      int           // sends at most (of an ack; of a record refused for no responders)
	pause      time.Duration // the sweep's period: the least pause between two sends
	recordWait time.Duration // wait for a done record's answer before acking without it
}

var defaultAcks = ackConfig{timeout: ackTimeout, tries: ackTries, pause: ackRetryPause, recordWait: settleTimeout}

// pendingAck is an ack awaiting its confirmation, in one place of the
// completer's table.
type pendingAck struct {
	gen   uint64 // told apart from the earlier acks of the same place
	live  bool
	m     jetstream.Msg
	ev    *event
	out   Settled
	tries int       // sends so far
	due   time.Time // when to send again, or give up
	err   error     // why the last send is not confirmed
	// recording: the done record rec is sent and its answer awaited; the
	// ack is not sent yet.
	recording bool
	rec       doneRecord
}

// ackCompleter is a route's confirmations: the subscription, the table of
// pending acks, and the sweep.
type ackCompleter struct {
	r      *route
	cfg    ackConfig
	nc     *nats.Conn
	prefix string // the route's inbox, "<inbox>."
	sub    *nats.Subscription
	free   chan int // places not in use: the bound on pending acks

	mu      sync.Mutex
	table   []pendingAck
	pending int

	kick     chan struct{} // wakes the sweep for a first pending ack
	stopping chan struct{}
	done     chan struct{}
}

func newAckCompleter(r *route, size int) *ackCompleter {
	c := &ackCompleter{r: r, cfg: defaultAcks, free: make(chan int, size), table: make([]pendingAck, size)}
	for i := range size {
		c.free <- i
	}
	return c
}

// start subscribes to the route's inbox on nc and starts the sweep. When
// the subscription fails, the route's workers wait for their acks'
// confirmations themselves (ackMsg).
func (c *ackCompleter) start(nc *nats.Conn) {
	c.nc = nc
	c.prefix = nc.NewInbox() + "."
	sub, err := nc.Subscribe(c.prefix+">", c.confirmed)
	if err != nil {
		c.r.log.Warn().Str("error", err.Error()).Msg("ack confirmations not subscribed; workers wait for them")
		return
	}
	c.sub = sub
	c.kick = make(chan struct{}, 1)
	c.stopping = make(chan struct{})
	c.done = make(chan struct{})
	go c.run()
}

// running reports whether the completer takes acks (send).
func (c *ackCompleter) running() bool { return c.sub != nil }

// stop waits until every pending ack is confirmed or given up, then
// unsubscribes. It is called once no worker sends any more.
func (c *ackCompleter) stop() {
	if c.sub == nil {
		return
	}
	close(c.stopping)
	<-c.done
	_ = c.sub.Unsubscribe()
}

// send acks m without waiting for the confirmation, after storing rec
// when it is set (a reservation's done record), and reports false when the
// completer is not running (the caller then acks itself).
func (c *ackCompleter) send(m jetstream.Msg, ev *event, out Settled, rec *doneRecord) bool {
	if c.sub == nil {
		return false
	}
	i := <-c.free
	c.mu.Lock()
	p := &c.table[i]
	p.gen++
	p.live, p.m, p.ev, p.out, p.tries, p.err = true, m, ev, out, 1, nil
	p.recording = rec != nil
	wait := c.cfg.timeout
	if p.recording {
		p.rec, wait = *rec, c.cfg.recordWait
	}
	p.due = time.Now().Add(wait)
	gen := p.gen
	c.pending++
	first := c.pending == 1
	c.mu.Unlock()
	if first {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	if rec != nil {
		c.publishRecord(i, gen, rec)
	} else {
		c.publish(i, gen, m)
	}
	return true
}

// replyOf is the reply subject of place i's send of generation gen.
func (c *ackCompleter) replyOf(i int, gen uint64) string {
	var buf [80]byte
	b := append(buf[:0], c.prefix...)
	b = strconv.AppendInt(b, int64(i), 10)
	b = append(b, '.')
	return string(strconv.AppendUint(b, gen, 10))
}

// publish sends the ack of place i (generation gen) to m's reply subject.
// A send that fails is tried again at the next sweep.
func (c *ackCompleter) publish(i int, gen uint64, m jetstream.Msg) {
	if err := c.nc.PublishRequest(m.Reply(), c.replyOf(i, gen), ackBody); err != nil {
		c.failed(i, gen, err)
	}
}

// publishRecord sends place i's done record, as a KV Update does.
func (c *ackCompleter) publishRecord(i int, gen uint64, rec *doneRecord) {
	msg := &nats.Msg{Subject: rec.subject, Reply: c.replyOf(i, gen), Data: rec.value, Header: nats.Header{}}
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rec.rev, 10))
	if err := c.nc.PublishMsg(msg); err != nil {
		c.failed(i, gen, err)
	}
}

// failed notes a send that did not go out: it is tried again (or given
// up) at the next sweep.
func (c *ackCompleter) failed(i int, gen uint64, err error) {
	c.mu.Lock()
	if p := &c.table[i]; p.live && p.gen == gen {
		p.err, p.due = err, time.Now().Add(c.cfg.pause)
	}
	c.mu.Unlock()
}

var ackBody = []byte("+ACK")

// confirmed is JetStream's answer to an ack or a done record: a
// confirmation, or a "no responders" status (sent again at the next
// sweep); for a record, its publish acknowledgement, which may be a
// refusal (the reservation was changed meanwhile).
func (c *ackCompleter) confirmed(msg *nats.Msg) {
	tok := strings.TrimPrefix(msg.Subject, c.prefix)
	dot := strings.IndexByte(tok, '.')
	if dot < 0 {
		return
	}
	i, err1 := strconv.Atoi(tok[:dot])
	gen, err2 := strconv.ParseUint(tok[dot+1:], 10, 64)
	if err1 != nil || err2 != nil || i < 0 || i >= len(c.table) {
		return
	}
	refused := len(msg.Data) == 0 && msg.Header.Get("Status") == "503"
	c.mu.Lock()
	p := &c.table[i]
	if !p.live || p.gen != gen {
		c.mu.Unlock()
		return // an earlier send's answer, already settled
	}
	if refused {
		p.err, p.due = nats.ErrNoResponders, time.Now().Add(c.cfg.pause)
		c.mu.Unlock()
		return
	}
	if p.recording {
		c.recorded(i, pubAckError(msg.Data)) // unlocks
		return
	}
	c.finish(i, nil) // unlocks
}

// pubAckError is the error of a publish acknowledgement, nil for a stored
// message.
func pubAckError(data []byte) error {
	if !bytes.Contains(data, []byte(`"error"`)) {
		return nil
	}
	var ack struct {
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(data, &ack); err != nil || ack.Error == nil {
		return errors.New("bridge: unreadable answer to a done record")
	}
	return errors.New("nats: API error: " + ack.Error.Description)
}

// recorded ends place i's done record with err (nil: stored) and sends its
// ack. Called with c.mu held; it unlocks it.
func (c *ackCompleter) recorded(i int, err error) {
	p := &c.table[i]
	p.recording, p.rec = false, doneRecord{}
	p.gen++ // a late answer to the record is not the ack's
	p.tries, p.err, p.due = 1, nil, time.Now().Add(c.cfg.timeout)
	gen, m, ev := p.gen, p.m, p.ev
	c.mu.Unlock()
	if err != nil {
		r := c.r
		r.b.m.idempotencyErrors.WithLabelValues(r.cfg.Name).Inc()
		msgLog(r.log.Warn(), ev).Str("error", err.Error()).Msg("delivered, but not recorded as done: a redelivery would be sent again")
	}
	c.publish(i, gen, m)
}

// finish reports place i's settlement with err (nil: confirmed) and frees
// the place. Called with c.mu held; it unlocks it.
func (c *ackCompleter) finish(i int, err error) {
	p := &c.table[i]
	ev, out := p.ev, p.out
	p.live, p.m, p.ev, p.out, p.err, p.recording, p.rec = false, nil, nil, Settled{}, nil, false, doneRecord{}
	c.mu.Unlock()
	// The settlement is reported before the ack stops counting as
	// pending: stop (and so Run) returns only after every report (OnSettle,
	// the span's end, which a tracer shut down after Run would drop).
	c.r.reportAck(ev, out, err)
	c.mu.Lock()
	c.pending--
	c.mu.Unlock()
	c.free <- i
}

// run sweeps the pending acks every cfg.pause while there are any, until
// stopped with none pending.
func (c *ackCompleter) run() {
	defer close(c.done)
	t := time.NewTimer(c.cfg.pause)
	defer t.Stop()
	stopping := c.stopping
	for {
		c.mu.Lock()
		n := c.pending
		c.mu.Unlock()
		if n == 0 {
			if stopping == nil {
				return
			}
			select {
			case <-c.kick:
				continue
			case <-stopping:
				stopping = nil
				continue
			}
		}
		t.Reset(c.cfg.pause)
		select {
		case <-t.C:
		case <-stopping:
			stopping = nil // finish what is pending, then return
			<-t.C
		}
		c.sweep(time.Now())
	}
}

// sweep sends again each pending ack that is due, and gives up on those
// sent cfg.tries times; a done record that is due is sent again after "no
// responders", or else given up (its ack is sent all the same).
func (c *ackCompleter) sweep(now time.Time) {
	for i := range c.table {
		c.mu.Lock()
		p := &c.table[i]
		if !p.live || now.Before(p.due) {
			c.mu.Unlock()
			continue
		}
		if p.recording {
			if !errors.Is(p.err, nats.ErrNoResponders) || p.tries >= c.cfg.tries {
				c.recorded(i, p.givenUp()) // unlocks
				continue
			}
			gen, rec := p.again(now, c.cfg.recordWait), p.rec
			c.mu.Unlock()
			c.publishRecord(i, gen, &rec)
			continue
		}
		if p.tries >= c.cfg.tries {
			c.finish(i, p.givenUp()) // unlocks
			continue
		}
		gen, m := p.again(now, c.cfg.timeout), p.m
		c.mu.Unlock()
		c.publish(i, gen, m)
	}
}

// givenUp is why a place's last send is given up: its error, or no
// answer in time.
func (p *pendingAck) givenUp() error {
	if p.err == nil {
		return nats.ErrTimeout
	}
	return p.err
}

// again counts one more send, due to be answered within wait, and returns
// the place's generation for its reply subject.
func (p *pendingAck) again(now time.Time, wait time.Duration) uint64 {
	p.tries++
	p.err, p.due = nil, now.Add(wait)
	return p.gen
}

// reportAck reports a settlement by ack: err is nil when JetStream
// confirmed it.
func (r *route) reportAck(ev *event, out Settled, err error) {
	msgLog(r.log.Debug(), ev).Int("tries", out.Tries).Str("outcome", string(out.Outcome)).Msg("settled")
	if err != nil {
		// The broker redelivers after ack_wait; with idempotency the second
		// delivery is recognised.
		msgLog(r.log.Warn(), ev).Str("outcome", string(out.Outcome)).Str("error", err.Error()).Msg("settlement not confirmed by JetStream")
	}
	endDelivery(ev, out, 0)
	r.b.settled(out)
}
