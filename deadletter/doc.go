// Package deadletter is the operator's side of the dead-letter stream: it
// lists, shows, replays and purges the messages that the bridge could not
// deliver, and names what a dead letter carries.
//
// A dead letter is the original message, stored by the bridge (package
// bridge) on <subject_prefix>.<route>.<original subject> of the
// dead-letter stream, with headers that say why (HeaderReason,
// HeaderFailure, HeaderStatus, HeaderError) and where it came from
// (HeaderRoute, HeaderOriginalStream, HeaderOriginalSequence,
// HeaderOriginalSubject). Its Nats-Msg-Id is MsgID of the delivery, so a
// retried dead-lettering stores one copy (docs/operating.md#dead-letters).
//
// Open binds a Queue to the dead-letter stream of a configuration. Its
// methods never consume a dead letter:
//
//	List    the dead letters a Filter selects, in stream order (Message)
//	Get     one dead letter with its payload ("bridge dlq show")
//	Replay  republish one to its original subject, then delete it
//	Delete  remove one ("bridge dlq purge")
//
// Skip is the rule a replay of what an operator selected applies first:
// a dead letter whose reason is permanent for its payload
// (Reason.PermanentForPayload: invalid-event, event-id-conflict) is left
// alone unless its reason is included ("bridge dlq replay --include").
//
// Replay first passes the dead letter through the replay guard
// (CheckReplay): every header of a dead letter is untrusted, so it is
// republished only to a literal subject inside the configured stream's
// and route's subjects, never to a system subject, a reply inbox or the
// dead-letter prefix; a refusal is a *ReplayRefusedError. The republished
// event keeps its Event-Id and carries Nats-Msg-Id ReplayMsgID, which no
// producer can compute, so a replay run again inside the stream's
// duplicate window stores nothing new, and a duplicate acknowledgement is
// read back before it counts (else a *ReplayCollisionError).
package deadletter
