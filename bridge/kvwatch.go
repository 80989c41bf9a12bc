package bridge

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// followKV follows the records of kv whose keys match filter until ctx
// ends, for the state replicas share through JetStream: fleet pauses and
// slots (fleet.go), ordered routes' members (ordered_balance.go) and
// blocked keys (ordered_route.go). Each update goes to apply, in order,
// on the caller's goroutine; nil says the records stored so far are all
// in. A watch that cannot be made, or ends by itself (the server
// restarted, the bucket was deleted), is made again after a pause that
// backs off (newRetryBackoff; reset once a watch has caught up); lost is
// called first, so that what was built from the old watch can be dropped
// or marked stale: the new watch sends every record again. Records are
// untrusted: apply validates each before acting on it.
func followKV(ctx context.Context, kv jetstream.KeyValue, filter string, apply func(jetstream.KeyValueEntry), lost func()) {
	retry := newRetryBackoff()
	for ctx.Err() == nil {
		if w, err := kv.Watch(ctx, filter); err == nil {
			if applyUpdates(ctx, w, apply) {
				retry.Reset()
			}
			_ = w.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		lost()
		sleep(ctx, retry.NextBackOff())
	}
}

// applyUpdates gives the updates of w to apply until ctx ends or w
// closes, and reports whether w caught up (sent its nil).
func applyUpdates(ctx context.Context, w jetstream.KeyWatcher, apply func(jetstream.KeyValueEntry)) (synced bool) {
	for {
		select {
		case <-ctx.Done():
			return synced
		case e, ok := <-w.Updates():
			if !ok {
				return synced
			}
			synced = synced || e == nil
			apply(e)
		}
	}
}
