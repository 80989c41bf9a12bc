package main

import (
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sotercare/jetbridge/internal/buildinfo"
)

// processState is what the process-level series read at scrape time: the
// NATS connection and the bridge's readiness, both absent until made.
type processState struct {
	nc    atomic.Pointer[nats.Conn]
	ready atomic.Pointer[func() error]
}

// registerProcessMetrics registers the series that describe the process
// rather than a route (docs/deploy.md, "Alerts and the dashboard"); they
// exist from the first scrape, before NATS is reached:
//
//   - bridge_build_info{version,revision} 1;
//   - bridge_ready 1 while /readyz would answer 200, else 0;
//   - bridge_nats_connected 1 while the NATS connection is up, else 0.
//
// Each reads in-memory state: a scrape makes no request to NATS.
func registerProcessMetrics(reg prometheus.Registerer, st *processState) {
	bi := buildinfo.Read()
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "bridge_build_info",
		Help: "Always 1; its labels are the version and VCS revision the binary was built from (bridge version).",
	}, []string{"version", "revision"})
	info.WithLabelValues(bi.Version, bi.Revision).Set(1)
	ready := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "bridge_ready",
		Help: "1 while the bridge is ready (/readyz answers 200), else 0.",
	}, func() float64 {
		if f := st.ready.Load(); f != nil && (*f)() == nil {
			return 1
		}
		return 0
	})
	connected := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "bridge_nats_connected",
		Help: "1 while the bridge's NATS connection is connected, else 0 (connecting, reconnecting or closed).",
	}, func() float64 {
		if nc := st.nc.Load(); nc != nil && nc.IsConnected() {
			return 1
		}
		return 0
	})
	reg.MustRegister(info, ready, connected)
}
