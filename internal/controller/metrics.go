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
)

func init() {
	metrics.Registry.MustRegister(configMapWrites, specValidations)
}
