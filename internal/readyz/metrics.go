// The Prometheus registry of readyz: its own autoconfig_readyz_* series
// plus the Go and process collectors.

package readyz

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/modelsphere/autoconfig/internal/buildinfo"
	"github.com/modelsphere/autoconfig/internal/readiness"
)

// metricsPrefix prefixes every readyz metric.
const metricsPrefix = "autoconfig_readyz_"

type metrics struct {
	requests *prometheus.CounterVec
	ready    prometheus.Gauge
	enforced prometheus.Gauge
	missing  prometheus.Gauge
}

// newRegistry builds the private registry: readyz's own series (prefixed),
// plus the Go and process collectors.
func newRegistry(d *readiness.Detector) (*prometheus.Registry, *metrics) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector("readyz"))
	r := prometheus.WrapRegistererWithPrefix(metricsPrefix, reg)
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "requests_total", Help: "GET /readyz answers by HTTP status code.",
		}, []string{"code"}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ready", Help: "1 when the last /readyz answered ready (including fail-open), else 0.",
		}),
		enforced: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "enforced", Help: "1 when the last /readyz read every socket table; 0 when it failed open.",
		}),
		missing: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "missing_listeners", Help: "Required ports without a LISTEN socket at the last /readyz (unverified ones included when not enforced).",
		}),
	}
	r.MustRegister(m.requests, m.ready, m.enforced, m.missing,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "scans_total", Help: "Scans of the socket tables; at most about one per --cache-ttl however many callers.",
		}, func() float64 { return float64(d.Scans()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "required_listeners", Help: "Number of configured --readiness-required-listener ports.",
		}, func() float64 { return float64(len(d.Ports())) }),
	)
	return reg, m
}
