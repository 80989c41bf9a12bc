// Package sotercare is the SoterCare domain: it validates sensor readings,
// classifies them into a care severity and a care route, and publishes
// every valid reading to JetStream through the public producer.Publisher. Its
// HTTP API (Handler) is POST /api/v1/events and GET /api/v1/health.
//
// SoterCare is a producer only: it never calls a caregiver itself. The
// bridge delivers its alerts, routing on subjects alone, so the subject
// carries both halves of SoterCare's decision:
//
//	<root>.<severity>.care.<route>.<eventType>
//
//	events.critical.care.caregiver.fall      fall 1          critical -> caregiver
//	events.warning.care.caregiver.vitals     bpm < 50, > 120 high     -> caregiver
//	events.warning.care.eventlog.moisture    80 % or more    medium   -> event log
//	events.info.care.eventlog.vitals         50..120 bpm     normal   -> event log
//	events.info.care.eventlog.fall           fall 0          normal   -> event log
//	events.info.care.eventlog.moisture       under 80 %      normal   -> event log
//
// severity is the bridge severity the care severity maps to (normal INFO,
// medium and high WARNING, critical CRITICAL); route is SoterCare's own
// decision (caregiver or eventlog), which the mapping alone would lose:
// medium and high are both WARNING but go to different places. The event
// type (Event-Type header) is the part after the severity, e.g.
// care.caregiver.fall. A bridge delivers caregiver alerts with the filters
// events.critical.care.caregiver.> and events.warning.care.caregiver.>
// (config/sotercare.yaml).
//
// The thresholds are synthetic, not clinical.
//
// Invariant: a reading is answered 202 only once JetStream has stored it
// (its PubAck arrived), under its eventId as Nats-Msg-Id, so a producer may
// retry a 503 with the same eventId without creating a second event.
package sotercare
