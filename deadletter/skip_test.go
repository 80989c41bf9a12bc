package deadletter

import (
	"errors"
	"strings"
	"testing"
)

// Skip leaves alone the dead letters whose reason is permanent for the
// payload unless include names the reason; its error carries the
// sequence and the reason only.
func TestSkip(t *testing.T) {
	d := Message{Seq: 7, EventID: "SECRET-ID", Subject: "events.SECRET", Reason: ReasonEventIDConflict}
	err := Skip(d)
	var sk *SkippedError
	if !errors.Is(err, ErrSkipped) || !errors.As(err, &sk) || sk.Seq != 7 || sk.Reason != ReasonEventIDConflict ||
		err.Error() != "deadletter: dead letter 7 skipped: reason event-id-conflict is permanent for its payload" {
		t.Fatalf("Skip of an event-id-conflict: %v", err)
	}
	if strings.Contains(err.Error(), "SECRET") {
		t.Errorf("the error quotes the dead letter: %v", err)
	}
	if err := Skip(d, ReasonInvalidEvent); err == nil {
		t.Errorf("Skip with another reason included: nil, want skipped")
	}
	if err := Skip(d, ReasonInvalidEvent, ReasonEventIDConflict); err != nil {
		t.Errorf("Skip with its reason included: %v", err)
	}
	for _, r := range []Reason{ReasonRejected, ReasonMaxDeliveries, "", "made-up"} {
		if err := Skip(Message{Seq: 1, Reason: r}); err != nil {
			t.Errorf("Skip of reason %q: %v, want nil", r, err)
		}
	}
	if err := Skip(Message{Seq: 2, Reason: ReasonInvalidEvent}); !errors.Is(err, ErrSkipped) {
		t.Errorf("Skip of an invalid event: %v", err)
	}
}
