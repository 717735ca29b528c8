// Package routemetrics keeps the controller's per-route gauges: four
// numbers per ModelRoute, turned into series when scraped.
package routemetrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
)

// The per-route gauges: one series each per ModelRoute, removed with the
// route. They are kept as four numbers per route and turned into series
// when scraped (Gauges.Collect), not as GaugeVec children: a child
// keeps its label pairs, its own metric and its hash entry: about 1.7 KB
// of live heap per route for the four (1.7 MB at 1000 routes, all of it
// scanned by every GC cycle), against under 100 bytes here
// (TestRouteSeriesMemory).

// Kind names one of a route's gauges.
type Kind int

const (
	Backends Kind = iota
	CartPeers
	LastWrite
	BlockedKeys
	kinds
)

// descs describe the gauges, by Kind.
var descs = [kinds]*prometheus.Desc{
	Backends:    desc("autoconfig_route_backends", "Backend endpoints in the route's last rendered output (status.backends)."),
	CartPeers:   desc("autoconfig_route_cart_peers", "CART endpoints discovered for the route (status.cartPeers)."),
	LastWrite:   desc("autoconfig_route_last_write_timestamp_seconds", "Unix time of the route's last output write by this controller process (absent until its first write)."),
	BlockedKeys: desc("autoconfig_route_blocked_keys", "Keys the route renders but may not write: held by another route (OutputConflict) or hand-written without a mark (OutputKeyForeign)."),
}

func desc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{"namespace", "route"}, nil)
}

// values are one route's gauges; set tells which have a value (a
// gauge never set has no series, as a GaugeVec child never created).
type values struct {
	v   [kinds]float64
	set uint8
}

// Gauges is the collector of the per-route gauges.
type Gauges struct {
	mu sync.Mutex
	m  map[types.NamespacedName]values
}

// Set sets gauge g of the route key.
func (c *Gauges) Set(key types.NamespacedName, g Kind, v float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[types.NamespacedName]values{}
	}
	rv := c.m[key]
	rv.v[g] = v
	rv.set |= 1 << g
	c.m[key] = rv
}

// Forget removes the route's series.
func (c *Gauges) Forget(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}

// Describe implements prometheus.Collector.
func (c *Gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector: a series per route and gauge
// that has a value.
func (c *Gauges) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	type series struct {
		key types.NamespacedName
		rv  values
	}
	all := make([]series, 0, len(c.m))
	for k, rv := range c.m {
		all = append(all, series{k, rv})
	}
	c.mu.Unlock()
	for _, s := range all {
		for g, d := range descs {
			if s.rv.set&(1<<g) != 0 {
				ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, s.rv.v[g], s.key.Namespace, s.key.Name)
			}
		}
	}
}
