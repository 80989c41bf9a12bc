package deadletter

import (
	"errors"
	"fmt"
	"slices"
)

// PermanentForPayload reports whether r says that the message itself can
// never be delivered, whatever the destination does: an invalid event
// (ReasonInvalidEvent) is invalid again when replayed, and an event id
// conflict (ReasonEventIDConflict) is found again as long as the route's
// idempotency record of the id stands. A replay skips such dead letters
// unless the operator names their reason (see Skip and
// docs/operating.md#replay-skips-what-cannot-succeed).
func (r Reason) PermanentForPayload() bool {
	return r == ReasonInvalidEvent || r == ReasonEventIDConflict
}

// ErrSkipped is matched by every *SkippedError.
var ErrSkipped = errors.New("deadletter: dead letter skipped")

// SkippedError is Skip's answer for a dead letter that a replay leaves
// alone: its reason is permanent for its payload and was not included.
// Reason is always one of Reasons (PermanentForPayload is true for it), so
// its text carries nothing from the dead letter but its sequence.
type SkippedError struct {
	Seq    uint64
	Reason Reason
}

func (e *SkippedError) Error() string {
	return fmt.Sprintf("deadletter: dead letter %d skipped: reason %s is permanent for its payload", e.Seq, e.Reason)
}

// Is matches ErrSkipped.
func (e *SkippedError) Is(target error) bool { return target == ErrSkipped }

// Skip is the replay rule for reasons that are permanent for the payload:
// a *SkippedError (matching ErrSkipped) when d's reason is one of them
// (Reason.PermanentForPayload) and not in include, else nil. It reads only
// d's headers, so d may come from List without data. Replay itself does
// not apply it: a caller that replays what an operator selected calls
// Skip first, as "bridge dlq replay" does (--include names the reasons).
func Skip(d Message, include ...Reason) error {
	if !d.Reason.PermanentForPayload() || slices.Contains(include, d.Reason) {
		return nil
	}
	return &SkippedError{Seq: d.Seq, Reason: d.Reason}
}
