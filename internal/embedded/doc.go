// Package embedded owns the bridge's default broker: a nats-server with
// JetStream started inside the bridge process, single-node by default, or
// one node of a cluster (Options.Cluster; the tests run 3-node clusters in
// one process).
//
// Invariants:
//
//   - Signals never reach the embedded server. NoSigs is always set, so the
//     server installs no SIGINT/SIGTERM/SIGHUP/SIGUSR handler and can never
//     call os.Exit behind the bridge's graceful drain; the process owner
//     decides when to call Shutdown.
//   - The JetStream store directory is always explicit. Start rejects an
//     empty StoreDir, so the server never falls back to the shared
//     $TMPDIR/nats/jetstream directory that other instances would collide on.
//   - One server per store directory. Start takes an exclusive lock on a
//     lock file in it (flock, dropped by the kernel if the process dies) and
//     Shutdown releases it; a second server on the same directory is
//     refused with ErrStoreDirLocked.
//   - The lock file is never followed or shared: it is opened with
//     O_NOFOLLOW and must be a regular file with a single link, else Start
//     fails with ErrUnsafeLockFile, naming the path and why, and writes
//     nothing (a link planted in the store dir cannot make the server
//     truncate another file).
//   - A store dir that other users may write to (o+w, e.g. a mode 0777
//     Kubernetes volume) is reported, not refused: Server.Warnings names
//     the directory and its mode. The package never logs by itself; the
//     caller logs the warnings (bridge run does, at warn level).
//   - The client listener is on a loopback address unless the caller opts out
//     with AllowNonLoopback. With NoListen there is no client listener at all
//     (no port is bound): only in-process clients (Server.InProcessConn)
//     reach the server; bridge dlq serves a stopped bridge's store so.
//   - ExistingStore never creates a store: Start refuses with ErrNoStore,
//     before taking the lock and without creating the directory, when the
//     store dir holds no JetStream store.
//
// The package imports only nats-server and the standard library.
// Production code reaches nats-server through this package only.
package embedded
