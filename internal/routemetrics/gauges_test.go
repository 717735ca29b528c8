package routemetrics

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/types"

	"github.com/modelsphere/autoconfig/internal/testbin"
)

// gatherRoute returns the series of one route in reg: metric name → value.
func gatherRoute(t *testing.T, reg *prometheus.Registry, key types.NamespacedName) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetType() != dto.MetricType_GAUGE {
			t.Errorf("%s: type %v, want a gauge", mf.GetName(), mf.GetType())
		}
		for _, m := range mf.GetMetric() {
			if labelIs(m, "namespace", key.Namespace) && labelIs(m, "route", key.Name) {
				out[mf.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestRouteSeries: a route's gauges appear once set, each on its own
// (the last write time is absent until the first write), carry the route's
// labels, follow the last value and are gone with the route; another
// route's series stay.
func TestRouteSeries(t *testing.T) {
	c := &Gauges{}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	a := types.NamespacedName{Namespace: "llm", Name: "qwen"}
	b := types.NamespacedName{Namespace: "llm", Name: "llama"}
	if got := gatherRoute(t, reg, a); len(got) != 0 {
		t.Fatalf("before any set: %v", got)
	}
	c.Set(a, Backends, 3)
	c.Set(a, CartPeers, 2)
	c.Set(a, BlockedKeys, 0)
	c.Set(b, Backends, 7)
	got := gatherRoute(t, reg, a)
	want := map[string]float64{"autoconfig_route_backends": 3, "autoconfig_route_cart_peers": 2, "autoconfig_route_blocked_keys": 0}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("route a: %v, want %v (no last write before the first)", got, want)
	}
	c.Set(a, Backends, 4)
	c.Set(a, LastWrite, 1700000000)
	got = gatherRoute(t, reg, a)
	if got["autoconfig_route_backends"] != 4 || got["autoconfig_route_last_write_timestamp_seconds"] != 1700000000 {
		t.Fatalf("after updates: %v", got)
	}
	c.Forget(a)
	if got := gatherRoute(t, reg, a); len(got) != 0 {
		t.Fatalf("after forget: %v", got)
	}
	if got := gatherRoute(t, reg, b); got["autoconfig_route_backends"] != 7 || len(got) != 1 {
		t.Fatalf("the other route: %v", got)
	}
}

// TestRouteSeriesMemory bounds the live heap the per-route gauges keep:
// four series for each of 5000 routes (many, so the heap other tests'
// goroutines move in the meantime is small per route). As GaugeVec children they kept
// 1,673 bytes per route (label pairs, a metric and a hash entry per
// series; measured with this loop), 1.7 MB at 1000 routes, all of it
// scanned by every GC cycle; here it is 84.
func TestRouteSeriesMemory(t *testing.T) {
	const routes = 5000
	keys := make([]types.NamespacedName, routes)
	for i := range keys {
		keys[i] = types.NamespacedName{Namespace: fmt.Sprintf("ns-%02d", i%10), Name: fmt.Sprintf("model-%05d", i)}
	}
	c := &Gauges{}
	before := testbin.HeapAfterGC()
	for i, k := range keys {
		c.Set(k, Backends, float64(i))
		c.Set(k, CartPeers, 1)
		c.Set(k, LastWrite, 1700000000)
		c.Set(k, BlockedKeys, 0)
	}
	perRoute := float64(testbin.HeapAfterGC()-before) / routes
	runtime.KeepAlive(c)
	runtime.KeepAlive(keys)
	t.Logf("%.0f bytes of live heap per route for its four gauges", perRoute)
	if perRoute > 300 {
		t.Fatalf("%.0f bytes per route for four gauges, want at most 300", perRoute)
	}
}

// labelIs reports whether m has the label k=v.
func labelIs(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k {
			return l.GetValue() == v
		}
	}
	return false
}
