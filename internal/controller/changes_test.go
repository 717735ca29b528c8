package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// TestOutputChangeEventNamesTheBackends: a route's write is an event on the
// route naming the ConfigMap, the key and the backends added and removed;
// a second write within OutputChangeEventInterval is not an event of its
// own (the log line has it) and is counted in the next one.
func TestOutputChangeEventNamesTheBackends(t *testing.T) {
	ns := namespace(t, "changes")
	startManager(t, ns)
	service(t, ns, "m", 8000)
	endpointSlice(t, ns, "m-a", "m", v4, 8000, up("10.3.0.1"))
	configMap(t, ns, "routes", nil, nil)
	createRoute(t, newRoute(ns, "m", "m"))
	waitKey(t, ns, "routes", routeKey("m"), []string{host("10.3.0.1")}, nil)
	messages := func() []string {
		var l eventsv1.EventList
		must(t, k8s.List(context.Background(), &l, client.InNamespace(ns)))
		var out []string
		for _, e := range l.Items {
			if e.Regarding.Name == "m" && e.Reason == ReasonOutputChanged {
				out = append(out, e.Note)
			}
		}
		return out
	}
	eventually(t, "the first OutputChanged event", func() (bool, string) {
		m := messages()
		return len(m) == 1 && strings.Contains(m[0], "wrote "+ns+"/routes "+routeKey("m")) && strings.Contains(m[0], "1 backends"), fmt.Sprint(m)
	})
	endpointSlice(t, ns, "m-a", "m", v4, 8000, up("10.3.0.2"))
	waitKey(t, ns, "routes", routeKey("m"), []string{host("10.3.0.2")}, nil)
	time.Sleep(500 * time.Millisecond) // an event, if one were sent, would be listed by now
	if m := messages(); len(m) != 1 {
		t.Fatalf("a second write within %s made another event: %q", OutputChangeEventInterval, m)
	}

	// Per-route metrics, removed with the route.
	eventually(t, "the route's metrics", func() (bool, string) {
		b, okB := routeGauge(t, "autoconfig_route_backends", ns, "m")
		w, okW := routeGauge(t, "autoconfig_route_last_write_timestamp_seconds", ns, "m")
		k, okK := routeGauge(t, "autoconfig_route_blocked_keys", ns, "m")
		return okB && b == 1 && okW && w > 0 && okK && k == 0, fmt.Sprint(b, w, k)
	})
	must(t, k8s.Delete(context.Background(), getRoute(t, ns, "m")))
	eventually(t, "the route's metrics to go with it", func() (bool, string) {
		_, ok := routeGauge(t, "autoconfig_route_backends", ns, "m")
		return !ok, ""
	})
}

// routeGauge is the value of a per-route gauge in the controller's registry.
func routeGauge(t *testing.T, name, ns, route string) (float64, bool) {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelIs(m, "namespace", ns) && labelIs(m, "route", route) {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

func TestChangeLogDiffAndRateLimit(t *testing.T) {
	var c changeLog
	k := types.NamespacedName{Namespace: "a", Name: "b"}
	t0 := time.Unix(1000, 0)
	if _, _, first, event, _ := c.record(k, []string{"10.0.0.1:80"}, t0); !first || !event {
		t.Fatalf("first write: first=%v event=%v", first, event)
	}
	added, removed, first, event, _ := c.record(k, []string{"10.0.0.2:80", "10.0.0.3:80"}, t0.Add(time.Second))
	if first || event || fmt.Sprint(added) != "[10.0.0.2:80 10.0.0.3:80]" || fmt.Sprint(removed) != "[10.0.0.1:80]" {
		t.Fatalf("second write: +%v -%v first=%v event=%v", added, removed, first, event)
	}
	if _, _, _, event, suppressed := c.record(k, []string{"10.0.0.2:80"}, t0.Add(OutputChangeEventInterval)); !event || suppressed != 1 {
		t.Fatalf("after the interval: event=%v suppressed=%d, want an event counting 1", event, suppressed)
	}
}
