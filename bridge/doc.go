// Package bridge delivers the messages of JetStream streams to HTTP
// destinations: one durable pull consumer per route, one long-lived
// failsafe-go pipeline per destination, and a settlement for every
// message (README "Delivery").
//
// # Invariants
//
//   - A source message is acked or terminated only after its outcome is
//     stored: the destination's 2xx seen, or its dead letter acknowledged
//     by JetStream. A dead letter that cannot be stored leaves the message
//     for redelivery; nothing is ever dropped.
//   - Every source message is settled in one place, settle (settle.go), by
//     the decision of Decide (decision.go), which is pure and is the whole
//     settlement table, unusual cases included (a message handed back as
//     its route stops, a message without JetStream metadata, a dead letter
//     that could not be stored). Each settlement is counted and reported
//     (bridge_messages_total, Options.OnSettle) exactly once.
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
// all of them have ended: per route, a pull loop, a watchdog and a fixed
// pool of max_in_flight workers; per bridge, the readiness watch and the
// max-deliveries safety net. Progress acks and outage reminders run on
// timers that their owners stop. No goroutine is started per message.
//
// # One message, file by file
//
//	pull.go          the route's pull loop fetches for free slots; a worker
//	                 takes the message from the pull
//	deliver.go       handle: parse (event.go), check the delivery budget,
//	                 build the request (request.go), reserve the event id
//	                 (idempotency.go), attempt and hold while the breaker
//	                 is open, record the reservation
//	destination.go   one attempt: the tries through the destination's
//	                 pipeline (retries, breaker, per-try timeout), each
//	                 over its HTTP transport (transport.go)
//	decision.go      Decide: the failure and delivery count -> Decision
//	settle.go        settle: dead letter first when needed
//	                 (deadletter_store.go), then ack, nak or term
//
// Around it: provision.go and consumer.go create the streams and bind the
// consumers (with the watchdog), readiness.go and admin.go serve /healthz,
// /readyz, /status and /metrics (metrics.go), safetynet.go dead-letters
// what JetStream gave up on (package deadletter is the operator's side of
// the dead-letter stream: list, show, replay with its guard, purge),
// parts.go names the decisions that tests
// replace with broken variants, and trace.go makes the spans of a
// delivery and its tries when Options.TracerProvider is set (README
// "Tracing"; nil: no span, no allocation).
package bridge
