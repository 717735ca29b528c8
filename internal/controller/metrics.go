package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metrics live in controller-runtime's registry (not the global default
// one), served by the manager's metrics server next to its reconcile and
// workqueue metrics; ours carry the autoconfig_ prefix.
var (
	configMapWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "autoconfig_configmap_outputs_total",
		Help: "Output ConfigMap visits by result: Written (one patch), Unchanged (no write), Missing, NotPermitted, RenderFailed.",
	}, []string{"result"})
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
)

func init() {
	metrics.Registry.MustRegister(configMapWrites, specValidations, appliedSeconds, consumerPodsGauge)
}
