package bridge

import (
	"sync"
	"time"

	"github.com/sotercare/jetbridge/config"
)

// retryBudget bounds a destination's in-process retries (transport and
// status) over a sliding second: a retry is allowed while the retries of
// the last second stay at or below ratio of its requests (retries
// included) plus minPerSecond. Beyond it the failure is left to the
// broker's redelivery, with its backoff.
//
// failsafe-go's budget bounds retries in flight against executions in
// flight, with no time window; that cannot give this rule (measured: 0.29
// of the requests with a ratio of 0.2), and a retry it refuses loses the
// last real failure. This budget is asked by the retry policies' AbortIf,
// which keeps the failure as it is.
type retryBudget struct {
	ratio        float64
	minPerSecond float64

	mu      sync.Mutex
	buckets [budgetBuckets]budgetBucket
}

const (
	budgetBuckets = 10
	budgetSlot    = time.Second / budgetBuckets
)

type budgetBucket struct {
	idx               int64 // which tenth of a second it counts
	requests, retries int
}

func newRetryBudget(c *config.RetryBudget) *retryBudget {
	if c == nil {
		return nil
	}
	return &retryBudget{ratio: c.Ratio, minPerSecond: float64(c.MinPerSecond)}
}

func (b *retryBudget) bucket(idx int64) *budgetBucket {
	bk := &b.buckets[idx%budgetBuckets]
	if bk.idx != idx {
		*bk = budgetBucket{idx: idx}
	}
	return bk
}

// request counts one HTTP request to the destination.
func (b *retryBudget) request(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.bucket(int64(now.UnixNano())/int64(budgetSlot)).requests++
}

// allowRetry reports whether one more retry fits the budget, and counts it
// when it does.
func (b *retryBudget) allowRetry(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	idx := int64(now.UnixNano()) / int64(budgetSlot)
	requests, retries := 0, 0
	for _, bk := range b.buckets {
		if bk.idx > idx-budgetBuckets && bk.idx <= idx {
			requests += bk.requests
			retries += bk.retries
		}
	}
	if float64(retries+1) > b.ratio*float64(requests)+b.minPerSecond {
		return false
	}
	b.bucket(idx).retries++
	return true
}
