// Package test holds jetbridge's black-box end-to-end scenarios. They build
// the real binaries, run them as child processes on loopback (an embedded
// JetStream, a local HTTP sink as the destination) and observe only what a
// user can: exit codes, output, NATS state and the HTTP requests that
// arrive. Servers, destinations and in-process bridges come from the
// public test kit (package jetbridgetest), as in a user's tests; what
// users should not depend on (child processes, cluster stepdowns, the
// no-loss ledger, credentials as configuration text) from
// internal/natstest.
//
// Invariants: every process a scenario starts is killed and reaped in
// t.Cleanup; every file it writes is under t.TempDir(); scenarios wait on
// conditions, never on the clock.
package test
