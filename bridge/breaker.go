package bridge

import (
	"context"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
)

// This file is a destination's circuit breaker as the rest of the bridge
// sees it: its state, the transitions reported in order, the outage log
// with its reminders, and the wait of a message the open breaker holds.

// halfOpenPoll is how often a held message looks for a free half-open
// permit while probes are running.
const halfOpenPoll = 50 * time.Millisecond

// Outage reminders: while a destination's breaker stays open, a warning
// says how many messages are held and when the next probe is due, first
// after outageRemindFirst, then at doubling intervals up to
// outageRemindMax (outageReminders).
const (
	outageRemindFirst = 10 * time.Second
	outageRemindMax   = 10 * time.Minute
)

// outageReminders is the schedule of the "still open" warnings: an
// exponential backoff without jitter.
func outageReminders() backoff.ExponentialBackOff {
	return backoff.ExponentialBackOff{
		InitialInterval: outageRemindFirst,
		Multiplier:      2,
		MaxInterval:     outageRemindMax,
	}
}

// outage is what the breaker's logs say about an outage in progress.
type outage struct {
	since    time.Time // when the breaker opened; zero while closed
	probes   int       // half-open probes that failed
	every    backoff.ExponentialBackOff
	reminder *time.Timer // the next "still open" warning
}

// BreakerState is a destination's circuit state, as in the
// bridge_circuit_state metric: 0 closed, 1 half-open, 2 open.
type BreakerState int

// Breaker states.
const (
	BreakerClosed BreakerState = iota
	BreakerHalfOpen
	BreakerOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerHalfOpen:
		return "half-open"
	case BreakerOpen:
		return "open"
	}
	return "closed"
}

func breakerState(s circuitbreaker.State) BreakerState {
	switch s {
	case circuitbreaker.OpenState:
		return BreakerOpen
	case circuitbreaker.HalfOpenState:
		return BreakerHalfOpen
	}
	return BreakerClosed
}

// state is the breaker's current state (closed when disabled).
func (d *destination) state() BreakerState {
	b := d.breaker()
	if b == nil {
		return BreakerClosed
	}
	return breakerState(b.State())
}

// breakerChanged is the breaker's transition listener: it reports the
// transition (in chain order) and wakes the messages the breaker holds.
func (d *destination) breakerChanged(e circuitbreaker.StateChangedEvent) {
	d.transition(breakerState(e.OldState), breakerState(e.NewState), d.onState)
	next := make(chan struct{})
	close(*d.changed.Swap(&next))
}

// slowStartAfterOutage starts the slow start when the breaker opens from
// closed: the ramp begins now, at one attempt at a time, so that held
// messages waking up while the breaker half-opens and closes pass the gate
// one by one; it grows once attempts succeed again.
func (d *destination) slowStartAfterOutage(e circuitbreaker.StateChangedEvent) {
	if e.OldState == circuitbreaker.ClosedState {
		d.gate.startRamp()
	}
}

// transition reports from -> to once every transition before it has been
// reported, so that logs, the state gauge and OnBreaker always see a
// consistent chain closed -> open -> half-open -> ... (failsafe-go calls
// its listener outside its lock, so two transitions racing on two
// goroutines can arrive swapped).
func (d *destination) transition(from, to BreakerState, onState func(dest string, from, to BreakerState)) {
	d.transMu.Lock()
	defer d.transMu.Unlock()
	d.early = append(d.early, [2]BreakerState{from, to})
	for {
		i := slices.IndexFunc(d.early, func(t [2]BreakerState) bool { return t[0] == d.reported })
		if i < 0 {
			if len(d.early) < 8 {
				return // wait for the missing predecessor
			}
			i = 0 // cannot happen; never let reports stall
		}
		t := d.early[i]
		d.early = slices.Delete(d.early, i, i+1)
		d.reported = t[1]
		d.logTransition(t[0], t[1])
		if onState != nil {
			onState(d.name, t[0], t[1])
		}
	}
}

// logTransition logs an outage, not every breaker transition: the opening
// (with the messages held and when the first probe is due) and the
// closing (with how long it lasted) at warning level, each failed probe at
// debug level, and in between a reminder at falling rate (see
// outageReminders). Called with transMu held.
func (d *destination) logTransition(from, to BreakerState) {
	o := &d.outage
	switch {
	case to == BreakerOpen && o.since.IsZero():
		o.since, o.probes, o.every = time.Now(), 0, d.reminders
		o.every.Reset()
		d.log.Warn().Int64("held", d.held.Load()).Str("next_probe_in", d.nextProbe().String()).
			Msg("circuit breaker opened: no new requests to this destination until a probe succeeds; held messages keep their delivery count")
		d.scheduleReminder()
	case to == BreakerOpen:
		o.probes++
		d.log.Debug().Int("failed_probes", o.probes).Str("next_probe_in", d.nextProbe().String()).Msg("half-open probe failed; circuit breaker open again")
	case to == BreakerHalfOpen:
		d.log.Debug().Msg("circuit breaker half-open: probing")
	case to == BreakerClosed:
		if o.reminder != nil {
			o.reminder.Stop()
		}
		if !o.since.IsZero() {
			d.log.Warn().Str("outage", time.Since(o.since).Round(time.Millisecond).String()).Int("failed_probes", o.probes).
				Msg("circuit breaker closed: the destination answers again")
		}
		*o = outage{}
	}
}

// scheduleReminder arms the next "still open" warning. Called with transMu
// held.
func (d *destination) scheduleReminder() {
	o := &d.outage
	if d.closed {
		return
	}
	since := o.since
	o.reminder = time.AfterFunc(o.every.NextBackOff(), func() {
		d.transMu.Lock()
		defer d.transMu.Unlock()
		if d.closed || d.outage.since != since {
			return // the outage ended (or another began) meanwhile
		}
		d.log.Warn().Str("open_for", time.Since(since).Round(time.Second).String()).Int64("held", d.held.Load()).
			Int("failed_probes", d.outage.probes).Str("next_probe_in", d.nextProbe().String()).
			Msg("circuit breaker still open: the destination does not answer")
		d.scheduleReminder()
	})
}

// stopReminders ends the outage reminders for good (close).
func (d *destination) stopReminders() {
	d.transMu.Lock()
	defer d.transMu.Unlock()
	d.closed = true
	if d.outage.reminder != nil {
		d.outage.reminder.Stop()
	}
}

// nextProbe is the time until the breaker lets a probe through.
func (d *destination) nextProbe() time.Duration {
	b := d.breaker()
	if b == nil {
		return 0
	}
	return max(b.RemainingDelay(), 0).Round(time.Millisecond)
}

// waitUsable blocks while the breaker refuses every request: until its
// open delay has run out (the next request becomes a half-open probe), a
// transition, a half-open poll tick, or the end of ctx.
func (d *destination) waitUsable(ctx context.Context) error {
	for {
		b := d.breaker()
		if b == nil {
			return nil
		}
		changed := *d.changed.Load()
		var wait time.Duration
		switch breakerState(b.State()) {
		case BreakerClosed:
			return nil
		case BreakerOpen:
			if wait = b.RemainingDelay(); wait <= 0 {
				return nil
			}
		case BreakerHalfOpen:
			wait = halfOpenPoll
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-changed:
			t.Stop()
		case <-t.C:
			if d.state() == BreakerHalfOpen {
				return nil // a permit may be free
			}
		}
	}
}
