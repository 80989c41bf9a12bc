package bridge

import "github.com/prometheus/client_golang/prometheus"

// heldCollector exports bridge_destination_held{destination}: the messages
// of every route held by the destination's open breaker, read at scrape
// time from the count the destination keeps (no request to anything). The
// breaker alert needs it: a breaker left open on an idle bridge, with
// nothing held, stops no delivery (docs/alerts.md#jetbridgecircuitbreakeropen).
type heldCollector struct {
	b    *Bridge // its destinations in force
	desc *prometheus.Desc
}

func newHeldCollector(b *Bridge) heldCollector {
	return heldCollector{b: b, desc: prometheus.NewDesc("bridge_destination_held",
		"Messages of every route held by the destination's open (or probing) circuit breaker: they wait, their delivery count unspent.",
		[]string{"destination"}, nil)}
}

func (c heldCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c heldCollector) Collect(ch chan<- prometheus.Metric) {
	c.b.mu.RLock()
	defer c.b.mu.RUnlock()
	for name, d := range c.b.dests {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(d.held.Load()), name)
	}
}
