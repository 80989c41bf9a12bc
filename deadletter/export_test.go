package deadletter

import (
	"context"
	"errors"
)

// Test-only ways into the unexported halves of Replay, for the tests of
// package deadletter_test (which run a real bridge, and so cannot live in
// package deadletter: bridge imports it).

// Republish is the first half of Replay: guard, publish and wait for the
// PubAck of the configured stream, without deleting the dead letter. It
// is a replay killed between the PubAck and the delete.
func (q *Queue) Republish(ctx context.Context, d Message) (ReplayResult, error) {
	return q.republish(ctx, d)
}

// ReplayWithoutGuard is Replay with the replay guard left out: the
// broken variant of the negative controls that show a missing guard is
// caught. Everything else (the publish with its stream expectation and
// read-back, then the delete) is Replay's.
func (q *Queue) ReplayWithoutGuard(ctx context.Context, seq uint64) (ReplayResult, error) {
	d, err := q.Get(ctx, seq)
	if err != nil {
		return ReplayResult{}, err
	}
	msg, err := d.replayMsg(ReplayMsgID(d))
	if err != nil {
		return ReplayResult{Seq: d.Seq}, err
	}
	res, err := q.publish(ctx, d, msg)
	if err != nil {
		return res, err
	}
	if err := q.Delete(ctx, seq); err != nil && !errors.Is(err, ErrNotFound) {
		return res, err
	}
	return res, nil
}
