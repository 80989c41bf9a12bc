package sotercare

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nuid"

	"github.com/sotercare/jetbridge/producer"
)

// Errors of Submit besides *InvalidError. Match them with errors.Is.
var (
	// ErrDuplicate: JetStream already holds an event with this eventId
	// (inside the stream's duplicate window) and stored nothing.
	ErrDuplicate = errors.New("sotercare: duplicate event")
	// ErrBrokerUnavailable: the reading was not stored (no connection, no
	// stream, no PubAck in time). Retrying with the same eventId is safe.
	ErrBrokerUnavailable = errors.New("sotercare: broker unavailable")
)

// Receipt is SoterCare's answer for a reading JetStream stored: the body
// of the 202 response.
type Receipt struct {
	EventID       string   `json:"eventId"`
	Status        string   `json:"status"` // always "accepted"
	Severity      Severity `json:"severity"`
	RoutedTo      Route    `json:"routedTo"`
	Stream        string   `json:"stream"`
	Seq           uint64   `json:"seq"`
	CorrelationID string   `json:"correlationId"`
}

// Alert is the payload SoterCare publishes for a reading: the reading as
// received plus SoterCare's decision. It is what the bridge delivers as
// "payload" in its envelope.
type Alert struct {
	Reading
	CareSeverity  Severity `json:"careSeverity"`
	RoutedTo      Route    `json:"routedTo"`
	CorrelationID string   `json:"correlationId"`
}

// Event returns the bridge event for a classified reading under the subject
// root: the eventId as event id (Nats-Msg-Id and Event-Id), the subject
// Classification.Subject names, type care.<route>.<eventType>, the bridge
// severity, the Alert as payload, and deviceId, careSeverity and
// correlationId as metadata.
func Event(root string, r Reading, c Classification, correlationID string) (producer.Event, error) {
	subject, err := c.Subject(root, r)
	if err != nil {
		return producer.Event{}, err
	}
	payload, err := json.Marshal(Alert{Reading: r, CareSeverity: c.Severity, RoutedTo: c.Route, CorrelationID: correlationID})
	if err != nil {
		return producer.Event{}, err
	}
	return producer.Event{
		Subject:  subject,
		ID:       r.EventID,
		Type:     c.EventType(r),
		Severity: c.Severity.Bridge(),
		Payload:  payload,
		Metadata: map[string]string{
			"deviceId":      r.DeviceID,
			"careSeverity":  string(c.Severity),
			"correlationId": correlationID,
		},
	}, nil
}

// Submit validates and classifies r, publishes it with p and waits for
// JetStream's acknowledgement. An empty correlationID gets a new unique
// one. It returns the receipt, or:
//
//   - an *InvalidError (errors.Is ErrInvalidReading): nothing published;
//   - ErrDuplicate, with the receipt of the stored original (its stream and
//     sequence): nothing stored;
//   - an error matching ErrBrokerUnavailable: nothing stored, as far as
//     SoterCare can tell; retry with the same eventId.
func Submit(ctx context.Context, p *producer.Publisher, r Reading, correlationID string) (Receipt, error) {
	c, err := Classify(r)
	if err != nil {
		return Receipt{}, err
	}
	if correlationID == "" {
		correlationID = nuid.Next()
	}
	ev, err := Event(p.Root(), r, c, correlationID)
	if err != nil {
		return Receipt{}, err
	}
	res, err := p.Publish(ctx, ev)
	if err != nil {
		return Receipt{}, fmt.Errorf("%w: %w", ErrBrokerUnavailable, err)
	}
	rc := Receipt{
		EventID: r.EventID, Status: "accepted", Severity: c.Severity, RoutedTo: c.Route,
		Stream: res.Stream, Seq: res.Seq, CorrelationID: correlationID,
	}
	if res.Duplicate {
		return rc, ErrDuplicate
	}
	return rc, nil
}
