package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/modelsphere/autoconfig/internal/buildinfo"
	"github.com/modelsphere/autoconfig/internal/routemetrics"
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

// routeSeries are the per-route gauges (internal/routemetrics).
var routeSeries = &routemetrics.Gauges{}
