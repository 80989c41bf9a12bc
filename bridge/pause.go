package bridge

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Pauses between tries of something that failed (a pull, a provisioning,
// a reservation the bucket refused): 100 ms doubling to 5 s.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 5 * time.Second
)

// newRetryBackoff paces repeated failures: retryFirst doubling to
// retryMax, without jitter. Its owner calls Reset after a success.
func newRetryBackoff() *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{
		InitialInterval: retryFirst,
		Multiplier:      2,
		MaxInterval:     retryMax,
	}
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
