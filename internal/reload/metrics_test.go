package reload

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func counterValue(t *testing.T, m *Metrics, result string) float64 {
	t.Helper()
	return testutil.ToFloat64(m.Reloads.WithLabelValues(result))
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	return testutil.ToFloat64(g)
}
