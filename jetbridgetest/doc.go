// Package jetbridgetest runs the real thing inside a user's own go test: an
// embedded JetStream server (NewServer), the real bridge (StartBridge) and
// a recording, programmable HTTP destination (NewReceiver), all on
// 127.0.0.1, with nothing to install and no Docker. A producer service is
// tested by publishing through real JetStream and asserting what arrived;
// a receiver service by being the bridge's destination.
//
// It is shaped like net/http/httptest:
//
//   - every constructor takes the test (testing.TB) first and stops what it
//     started in t.Cleanup: servers, connections, bridges, receivers;
//   - there is no global state: ports are random loopback ports and store
//     directories come from t.TempDir, so any number of kits run in
//     parallel tests (t.Parallel) without colliding;
//   - waits (Receiver.WaitCount, Receiver.WaitEvent, Bridge.WaitSettled,
//     Bridge.WaitEvent, Bridge.WaitQuiet, Bridge.WaitDeadLetters) block on
//     the condition, not on the clock, and fail the test after Timeout
//     (or the receiver's or bridge's own wait timeout: WithWaitTimeout,
//     WithBridgeWaitTimeout, SetWaitTimeout) listing what they saw so far;
//     Receiver.AssertNoneWithin and AssertNoEventWithin fail it as soon as
//     a request arrives within a window. A method that can fail the test takes
//     the test as its first argument, so it can be called from a subtest.
//
// The kit's connections (Server.JetStream, Server.Conn, Server.Connect, and
// so every Bridge's) talk to the kit's own server only. Every server has a
// name of its own, kept across restarts, and each dial, the first and every
// reconnect, checks the name the server announces before the client sends
// anything, credentials included. If another server answers on the port
// (another test's server took it while this one was down), the connection
// is closed and the test fails naming both servers: nothing is published to
// or consumed from a foreign server. Server.Restart never comes back on a
// port someone else took: it fails the test at once, naming the port.
//
// A wait fails the test with t.Fatalf: call it from the goroutine running
// the test.
//
// Its API is made of standard-library, nats.go and jetbridge's public
// types (bridge, config, webhook); nothing internal appears in a
// signature. Inside, it runs the same test servers as jetbridge's own
// tests, from internal packages (internal/natstest for the JetStream
// server, internal/sinktest for the receiver), and logs the bridge through
// zerolog, as bridge.Options wants: importing the kit brings those into a
// test binary, not into the program under test. Its stability is stated in
// docs/testing.md#testing-your-producer-and-receiver.
package jetbridgetest
