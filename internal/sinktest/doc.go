// Package sinktest owns the fake destinations for delivery tests: a
// programmable HTTP sink (Sink) that answers each request according to a
// Script and records what arrived, and a raw TCP Closer that accepts
// connections and closes them without answering.
//
// Invariants:
//
//   - Both listen on 127.0.0.1 only and are closed in t.Cleanup.
//   - Every request is recorded on arrival, before the script's answer is
//     applied, so a test can observe requests that hang or are cut off.
//   - Closing never blocks on a scripted Hang or Delay: closing releases
//     them first, and they end by dropping the connection, never by sending
//     a success status.
//   - All methods are safe for concurrent use.
//
// sinktest is imported only by tests and by the public test kit
// (package jetbridgetest), which builds on it. It may import internal/embedded,
// nats-server, nats.go (nats and jetstream) and the standard library.
package sinktest
