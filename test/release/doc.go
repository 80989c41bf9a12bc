// Package release holds the release checks of jetbridge: the licences of
// the modules linked into the binaries, the versions that the binaries
// report when built from a tag, a later commit, a modified tree or the
// module proxy, and the systemd unit in deploy/systemd.
//
// It is a module of its own, so that its dependencies (licensecheck,
// golang.org/x/mod) are not the bridge's:
//
//	cd test/release && go vet ./... && go test -count=1 ./...
package release
