package controller

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/modelsphere/autoconfig/internal/buildinfo"
)

// Metrics live in controller-runtime's registry (not the global default
// one), served by the manager's metrics server next to its reconcile and
// workqueue metrics; ours carry the autoconfig_ prefix.
var (
	configMapWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "autoconfig_configmap_outputs_total",
		Help: "Output ConfigMap visits by result: Written (one patch), Unchanged (no write), Missing, NotPermitted, RenderFailed.",
	}, []string{"result"})
	initialSyncReconciles = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "autoconfig_initial_sync_reconciles_total",
		Help: "Routes reconciled by the initial sync when the controller starts leading (all at once, each ConfigMap written once); not in controller_runtime_reconcile_total.",
	})
	specValidations = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "autoconfig_spec_validations_total",
		Help: "CUE validations of a route spec (once per spec generation, not per endpoint change).",
	})
	appliedSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "autoconfig_applied_seconds",
		Help:    "From the reconcile that changed a route's nginx output to the first reconcile that saw every consumer pod reporting it serves that output (status condition Applied=True).",
		Buckets: prometheus.ExponentialBuckets(0.1, 2, 12),
	})
	consumerPodsGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "autoconfig_route_consumer_pods",
		Help: "A route's consumer pods (behind spec.nginx.service) by state: Synced (serve the current output), Stale (serve another: not reloaded yet, a failed check, a quarantined key), NotTracked (no served report).",
	}, []string{"namespace", "route", "state"})
	changeToWrite = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "autoconfig_change_to_write_seconds",
		Help:    "From the start of the reconcile that found a change (an EndpointSlice, a spec, a ConfigMap event) to the end of the route's output write: the controller's own latency, batch window included.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
	})
)

// writeConflicts reads the sink's count of refused compare-and-swap
// patches (another writer changed the ConfigMap first; retried on a fresh
// read). Set by SetupWithManager.
var writeConflicts = func() float64 { return 0 }

var writeConflictsCounter = prometheus.NewCounterFunc(prometheus.CounterOpts{
	Name: "autoconfig_configmap_write_conflicts_total",
	Help: "Output patches refused because the ConfigMap changed since it was read (a failed per-key test or a 409); each is retried on a fresh read. A steady rate means another writer keeps changing the same ConfigMap.",
}, func() float64 { return writeConflicts() })

func init() {
	metrics.Registry.MustRegister(configMapWrites, initialSyncReconciles, specValidations, appliedSeconds, consumerPodsGauge, changeToWrite,
		routeSeries, writeConflictsCounter, buildinfo.Collector("autoconfig"))
}

// The per-route gauges: one series each per ModelRoute, removed with the
// route. They are kept as four numbers per route and turned into series
// when scraped (routeGauges.Collect), not as GaugeVec children: a child
// keeps its label pairs, its own metric and its hash entry: about 1.7 KB
// of live heap per route for the four (1.7 MB at 1000 routes, all of it
// scanned by every GC cycle), against under 100 bytes here
// (TestRouteSeriesMemory).

// gaugeKind names one of a route's gauges.
type gaugeKind int

const (
	gaugeBackends gaugeKind = iota
	gaugeCartPeers
	gaugeLastWrite
	gaugeBlockedKeys
	routeGaugeCount
)

// routeGaugeDescs describe the gauges, by gaugeKind.
var routeGaugeDescs = [routeGaugeCount]*prometheus.Desc{
	gaugeBackends:    routeDesc("autoconfig_route_backends", "Backend endpoints in the route's last rendered output (status.backends)."),
	gaugeCartPeers:   routeDesc("autoconfig_route_cart_peers", "CART endpoints discovered for the route (status.cartPeers)."),
	gaugeLastWrite:   routeDesc("autoconfig_route_last_write_timestamp_seconds", "Unix time of the route's last output write by this controller process (absent until its first write)."),
	gaugeBlockedKeys: routeDesc("autoconfig_route_blocked_keys", "Keys the route renders but may not write: held by another route (OutputConflict) or hand-written without a mark (OutputKeyForeign)."),
}

func routeDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{"namespace", "route"}, nil)
}

// routeValues are one route's gauges; set tells which have a value (a
// gauge never set has no series, as a GaugeVec child never created).
type routeValues struct {
	v   [routeGaugeCount]float64
	set uint8
}

// routeGauges is the collector of the per-route gauges.
type routeGauges struct {
	mu sync.Mutex
	m  map[types.NamespacedName]routeValues
}

var routeSeries = &routeGauges{}

// set sets gauge g of the route key.
func (c *routeGauges) set(key types.NamespacedName, g gaugeKind, v float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[types.NamespacedName]routeValues{}
	}
	rv := c.m[key]
	rv.v[g] = v
	rv.set |= 1 << g
	c.m[key] = rv
}

// forget removes the route's series.
func (c *routeGauges) forget(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}

// Describe implements prometheus.Collector.
func (c *routeGauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range routeGaugeDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector: a series per route and gauge
// that has a value.
func (c *routeGauges) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	type series struct {
		key types.NamespacedName
		rv  routeValues
	}
	all := make([]series, 0, len(c.m))
	for k, rv := range c.m {
		all = append(all, series{k, rv})
	}
	c.mu.Unlock()
	for _, s := range all {
		for g, d := range routeGaugeDescs {
			if s.rv.set&(1<<g) != 0 {
				ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, s.rv.v[g], s.key.Namespace, s.key.Name)
			}
		}
	}
}
