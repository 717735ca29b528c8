package hagate

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/modelsphere/autoconfig/internal/buildinfo"
)

// MetricsPrefix is prepended to every hagate metric.
const MetricsPrefix = "autoconfig_hagate_"

// Metrics are hagate's Prometheus series, registered on a private
// registry so nothing global (client-go's or anyone else's) leaks in.
type Metrics struct {
	isLeader          prometheus.Gauge
	active            prometheus.Gauge
	healthy           prometheus.Gauge
	fixes             *prometheus.CounterVec
	leaderTransitions *prometheus.CounterVec
	activeTransitions *prometheus.CounterVec
	apiErrors         *prometheus.CounterVec
}

// NewMetrics registers the series on reg (prefixed with MetricsPrefix);
// with a nil reg they are created but not registered.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		isLeader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "is_leader", Help: "1 while this replica holds the Lease.",
		}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "active", Help: "1 while this pod carries the active label (as last read or written).",
		}),
		healthy: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "healthy", Help: "1 while the app port accepts connections and required listeners are present.",
		}),
		fixes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "label_fixes_total", Help: "Label writes: add/remove on this pod, fence on another pod's stale label.",
		}, []string{"action"}),
		leaderTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leader_transitions_total", Help: "Changes of leadership seen by this replica, by new state.",
		}, []string{"to"}),
		activeTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "active_transitions_total", Help: "Changes of this pod's active label, by new state.",
		}, []string{"to"}),
		apiErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "api_errors_total", Help: "Failed Kubernetes API calls of the label loop, by operation.",
		}, []string{"op"}),
	}
	for _, a := range []string{"add", "remove", "fence"} {
		m.fixes.WithLabelValues(a)
	}
	for _, s := range []string{"leader", "standby"} {
		m.leaderTransitions.WithLabelValues(s)
	}
	for _, s := range []string{"active", "inactive"} {
		m.activeTransitions.WithLabelValues(s)
	}
	if reg != nil {
		reg = prometheus.WrapRegistererWithPrefix(MetricsPrefix, reg)
		reg.MustRegister(m.isLeader, m.active, m.healthy, m.fixes, m.leaderTransitions, m.activeTransitions, m.apiErrors)
	}
	return m
}

// NewRegistry is hagate's private registry: its own series plus the Go and
// process collectors.
func NewRegistry() (*prometheus.Registry, *Metrics) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector("hagate"))
	return reg, NewMetrics(reg)
}
