// Package natstest owns the JetStream test harness: embedded servers on
// loopback with a per-test store dir, restarts on the same store dir and
// port, 3-node clusters in one process (ready only once a JetStream meta
// leader exists; stepdowns, node loss and restarts), client connections,
// condition polling, child processes for crash (SIGKILL) tests, a
// ledger that accounts for every published event, and servers whose
// users lack chosen publish permissions (StartUsers).
//
// Invariants:
//
//   - Everything it starts is owned by the calling test and stopped in
//     t.Cleanup: servers are shut down, connections closed, child processes
//     killed by PID and reaped.
//   - Servers listen on 127.0.0.1 only and always use an explicit store dir
//     (t.TempDir() unless the test passes its own), never the shared temp
//     dir.
//   - Every server has a name of its own (a cluster: a cluster name of its
//     own), kept across restarts. A connection made with ConnectPinned
//     checks it on every dial before sending anything, and is closed, and
//     the test failed, rather than use another server on the address.
//     Restarts never wait for a port someone else took: they fail at once,
//     naming it.
//   - Tests wait on conditions, never on the clock: Eventually polls until a
//     condition holds and fails with the last error it saw.
//
// natstest is imported only by tests and by the public test kit
// (package jetbridgetest), which builds on it. It may import internal/embedded,
// nats-server, nats.go (nats and jetstream) and the standard library.
package natstest
