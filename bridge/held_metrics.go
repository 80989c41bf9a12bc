package bridge

import "github.com/prometheus/client_golang/prometheus"

// heldCollector exports bridge_destination_held{destination}: the messages
// of every route held by the destination's open breaker, read at scrape
// time from the count the destination keeps (no request to anything). The
// breaker alert needs it: a breaker left open on an idle bridge, with
// nothing held, stops no delivery (docs/alerts.md#jetbridgecircuitbreakeropen).
type heldCollector struct {
	dests map[string]*destination
	desc  *prometheus.Desc
}

func newHeldCollector(dests map[string]*destination) heldCollector {
	return heldCollector{dests: dests, desc: prometheus.NewDesc("bridge_destination_held",
		"Messages of every route held by the destination's open (or probing) circuit breaker: they wait, their delivery count unspent.",
		[]string{"destination"}, nil)}
}

func (c heldCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c heldCollector) Collect(ch chan<- prometheus.Metric) {
	for name, d := range c.dests {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(d.held.Load()), name)
	}
}
