package deadletter

import "errors"

// Every error of the package starts with "deadletter: " and matches one
// of the sentinels or types below with errors.Is or errors.As, whatever
// wraps it. None carries a header value or payload byte, except
// ReplayRefusedError.Subject, which is kept out of its text.

var (
	// ErrNotFound means the dead-letter stream holds no message with the
	// requested sequence: it never existed, or it was replayed or purged.
	ErrNotFound = errors.New("deadletter: dead letter not found")

	// ErrNotReplayable means a dead letter cannot be republished as is: it
	// lacks a header that replay needs (Bridge-Original-Subject or
	// Event-Id), or the replay guard refused it (then it also matches
	// ErrReplayRefused).
	ErrNotReplayable = errors.New("deadletter: dead letter cannot be replayed")

	// ErrReplayRefused is matched by every refusal of the replay guard (a
	// *ReplayRefusedError): the dead letter names a subject or stream that
	// replay must not publish to, or was stored without its payload.
	// Nothing is published and the dead letter is kept.
	ErrReplayRefused = errors.New("deadletter: dead letter replay refused")

	// ErrReplayCollision means a replay's PubAck was a duplicate of a
	// message that is not this dead letter's replay: nothing was stored,
	// and the dead letter is kept (a *ReplayCollisionError).
	ErrReplayCollision = errors.New("deadletter: replay collision")
)

// kindError reads as one sentence and matches its sentinel kind.
type kindError struct {
	msg  string
	kind error
}

func (e *kindError) Error() string        { return e.msg }
func (e *kindError) Is(target error) bool { return target == e.kind }
