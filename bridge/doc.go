// Package bridge delivers the messages of JetStream streams to HTTP
// destinations: one durable pull consumer per route, one long-lived
// failsafe-go pipeline per destination, and a settlement for every
// message (docs/delivery.md#delivery).
//
// Build a Bridge with New from a validated configuration and a JetStream
// handle, then call Run: it provisions the streams and consumers, delivers
// until its context ends, drains and returns. Options.OnSettle reports
// each settled message (a Settled, whose Outcome is one of the Outcome
// constants).
//
// # Invariants
//
//   - A source message is acked or terminated only after its outcome is
//     stored: the destination's 2xx seen, or its dead letter acknowledged
//     by JetStream. A dead letter that cannot be stored leaves the message
//     for redelivery; nothing is ever dropped.
//   - Every source message is settled in one place, delivery.settle
//     (delivery.go), by the decision of the route's settlement table
//     (settlePolicy.decide, decision.go), which is pure and is the whole
//     table, unusual cases included (a message handed back as its route
//     stops, a message without JetStream metadata, a dead letter that
//     could not be stored). Each settlement is counted and reported
//     (bridge_messages_total, Options.OnSettle) exactly once; an ack is
//     reported once JetStream confirmed it, or gave no confirmation to its
//     last send (acks.go).
//   - A redelivery is always scheduled by the broker (NakWithDelay, never a
//     bare nak); only deliveries made while the breaker lets requests
//     through count toward max_deliver.
//   - Nothing is pulled that cannot be worked on at once: a route fetches as
//     many messages as it has free workers, and none while its
//     destination's breaker is open.
//
// # Goroutines
//
// Bridge.Run owns every goroutine the package starts and returns only once
// all of them have ended: per route, a pull loop (pullLoop, started and
// stopped by Run), a watchdog, a progress loop, a fixed pool of
// max_in_flight workers (workerPool) and the completer of its acks
// (ackCompleter, one inbox subscription and one sweep: acks.go, stopped
// after the workers once every pending ack is confirmed or given up); per
// bridge, the readiness watch and
// the max-deliveries safety net. Outage reminders run on timers that their
// owners stop. No goroutine is started per message.
//
// # One message, file by file
//
// Read these in order; each hands the message to the next.
//
//	bridge.go        New builds the routes and destinations; Run starts
//	                 each route's worker pool and pull loop
//	pull.go          the route's pull loop fetches for free slots; a
//	                 worker takes the message from the pull and hands it
//	                 to handle
//	delivery.go      one message's delivery, its stages in order:
//	                 receive, budget, build, reserve, attempt, record,
//	                 settle. Each stage calls into one file below
//	event.go         receive: the message as an event (id, type,
//	                 severity, metadata)
//	request.go       build: the payload and each try's HTTP request
//	idempotency.go   reserve and record: the event id's reservation in the
//	                 key-value bucket (routes with idempotency)
//	attempt.go       attempt: the tries through the destination's one
//	                 failsafe-go executor, built from named policies in
//	                 pipeline.go (flow control in flow.go, retries, breaker
//	                 in breaker.go); each try over its HTTP transport
//	                 (transport.go), its body finished in response.go
//	decision.go      settle: the settlement table, failure and delivery
//	                 count -> ack, redeliver after a delay, dead letter,
//	                 or hold while the breaker is open
//	deadletter_store.go  settle: the dead letter, stored before the
//	                 message is terminated
//	acks.go          settle: the ack of a 2xx (and with idempotency the
//	                 done record before it) sent without holding the
//	                 worker; confirmed, retried and reported by the route's
//	                 completer
//
// errors.go holds the failures the stages return (all matchable with
// errors.Is and errors.As), and trace.go the spans of a delivery and its
// tries when Options.TracerProvider is set (docs/tracing.md; nil: no span,
// no allocation).
//
// Around the delivery: destination.go builds a destination and its
// pipeline and replaces or closes them; provision.go and consumer.go
// create the streams and bind the consumers (with the watchdog);
// readiness.go and admin.go serve /healthz, /readyz, /status and /metrics
// (metrics.go); safetynet.go dead-letters what JetStream gave up on. The
// operator's side of the dead-letter stream (list, show, replay with its
// guard, purge) is package deadletter.
package bridge
