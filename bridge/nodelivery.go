package bridge

import (
	"context"
	"errors"
	"sync"
)

// ErrNoDelivery is the readiness reason of a bridge built with
// Options.NoDelivery once everything else is ready: /readyz answers 503
// with it, so that nothing counts the bridge as a delivering replica.
var ErrNoDelivery = errors.New("not delivering (no-delivery mode): streams and consumers are provisioned, nothing is pulled")

// idle is Run with Options.NoDelivery, once provisioned: the readiness
// watch runs, so /status shows every route's consumer state (its pending
// count stays put), but no route pulls, no worker or progress loop runs,
// and the MAX_DELIVERIES advisories are not read (nothing is
// dead-lettered): the streams, consumers and dead letters stay as they
// were for whoever inspects them. It returns nil when ctx ends.
func (b *Bridge) idle(ctx context.Context) error {
	var loops sync.WaitGroup
	// Watching from now on, before the goroutine runs: a /status asked
	// for as soon as Run is ready waits for the watch's first round
	// instead of finding no lookup yet.
	b.health.setWatching(true)
	loops.Go(func() { b.watchReadiness(ctx) })
	close(b.ready)
	b.log.Warn().Int("routes", len(b.routes)).Msg("bridge running without delivery: streams and consumers provisioned, nothing is pulled")
	<-ctx.Done()
	loops.Wait()
	for _, d := range b.dests {
		d.close()
	}
	b.log.Info().Msg("bridge stopped")
	return nil
}
