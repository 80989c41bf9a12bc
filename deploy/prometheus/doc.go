// Package monitoring holds the tests of jetbridge's Prometheus alert rules
// (alerts.yml, alerts_test.yml) and Grafana dashboard
// (../grafana/jetbridge.json). It is a module of its own so that the
// Prometheus libraries it parses PromQL with stay out of the bridge's
// module.
//
// The tests run promtool, a real Prometheus server and a real bridge built
// from the repository root; Debian's package prometheus provides both
// promtool and the server. Without them the tests skip, unless CI=true,
// where a missing tool is a failure:
//
//	cd deploy/prometheus && go vet ./... && go test -count=1 ./...
package monitoring
