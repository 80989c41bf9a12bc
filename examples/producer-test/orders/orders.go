// Package orders is a small producer service: it publishes an
// order.created event for every order placed, with the order id as the
// event id, so a retried PlaceOrder is stored once.
package orders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/producer"
)

// Order is what a customer placed.
type Order struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Cents    int    `json:"cents"`
}

// Service places orders.
type Service struct {
	pub *producer.Publisher
}

// New returns a Service publishing on js under the subject root "events".
func New(js jetstream.JetStream) *Service {
	return &Service{pub: producer.NewPublisher(js, "events")}
}

// PlaceOrder publishes the order.created event of o and returns once
// JetStream stored it (or recognised it as already stored).
func (s *Service) PlaceOrder(ctx context.Context, o Order) error {
	if o.ID == "" {
		return errors.New("orders: an order needs an id")
	}
	payload, err := json.Marshal(o)
	if err != nil {
		return err
	}
	_, err = s.pub.Publish(ctx, producer.Event{
		ID:       "order-" + o.ID,
		Type:     "order.created",
		Payload:  payload,
		Metadata: map[string]string{"customer": o.Customer},
	})
	if err != nil {
		return fmt.Errorf("orders: place %s: %w", o.ID, err)
	}
	return nil
}
