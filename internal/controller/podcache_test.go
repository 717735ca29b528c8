package controller

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/modelsphere/autoconfig/internal/informer"
	"github.com/modelsphere/autoconfig/internal/testenv"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// cachedPods are the pods ("ns/name", sorted) each running pod cache
// holds (a List of the cache without selector: its informer's whole
// store), what the controller keeps in memory.
func cachedPods(t testing.TB, p *informer.PodCaches) map[informer.PodKey][]string {
	t.Helper()
	out := map[informer.PodKey][]string{}
	for k, c := range p.Synced() {
		out[k] = testenv.PodKeys(t, c)
	}
	return out
}

// createPods creates n Deployment-shaped pods, with ips running and
// Ready (testenv.CreatePods).
func createPods(t testing.TB, ns, prefix string, n int, labels map[string]string, ips ...int) {
	t.Helper()
	testenv.CreatePods(t, k8s, ns, prefix, n, labels, ips...)
}

// TestPodCacheHoldsOnlySelectedPods: a selector route used to cache every
// pod of its namespace (200 here) for the 5 it selects. The pod cache is
// now per namespace and selector: it holds the 5, shared by the routes
// with the same selector (however written), another selector has its own,
// and each goes an idle delay after its last route.
func TestPodCacheHoldsOnlySelectedPods(t *testing.T) {
	ns := namespace(t, "podsel")
	h := startManager(t, ns)
	configMap(t, ns, "routes", nil, nil)
	createPods(t, ns, "noise", 200, map[string]string{"app": "noise"})
	var want []string
	for i := range 5 {
		pod(t, ns, fmt.Sprintf("sel-%d", i), map[string]string{"app": "sel", "tier": "a"}, fmt.Sprintf("10.8.0.%d", i+1), true, 8000)
		want = append(want, fmt.Sprintf("%s/sel-%d", ns, i))
	}
	pod(t, ns, "sel-b", map[string]string{"app": "sel", "tier": "b"}, "10.8.1.1", true, 8000)
	pod(t, ns, "other-c", map[string]string{"app": "other", "tier": "c"}, "10.8.1.2", true, 8000)
	selRoute := func(name, sel string) *v1alpha1.ModelRoute {
		return newRoute(ns, name, "", func(r *v1alpha1.ModelRoute) { r.Spec.Discovery = v1alpha1.Discovery{Selector: sel} })
	}
	hosts := func(ips ...string) []string {
		var out []string
		for _, ip := range ips {
			out = append(out, host(ip))
		}
		return out
	}
	sel5 := hosts("10.8.0.1", "10.8.0.2", "10.8.0.3", "10.8.0.4", "10.8.0.5")
	others := hosts("10.8.1.1", "10.8.1.2")

	createRoute(t, selRoute("a", "app=sel,tier in (a)"))
	waitKey(t, ns, "routes", routeKey("a"), sel5, others)
	keyA := informer.PodKey{Namespace: ns, Selector: "app=sel,tier in (a)"}
	if got := cachedPods(t, h.r.pods); len(got) != 1 || !slices.Equal(got[keyA], want) {
		t.Fatalf("pod caches hold %v, want only %s with the 5 selected pods %v", got, keyA, want)
	}
	first := h.r.pods.Synced()[keyA]

	// The same selector, written otherwise: the same cache.
	createRoute(t, selRoute("b", "tier in (a), app = sel"))
	waitKey(t, ns, "routes", routeKey("b"), sel5, others)
	if got := h.r.pods.Running(); !slices.Equal(got, []informer.PodKey{keyA}) {
		t.Fatalf("pod caches %v, want only %s (shared)", got, keyA)
	}
	if h.r.pods.Synced()[keyA] != first {
		t.Fatal("the second route with the same selector started another pod cache")
	}

	// Another selector (set-based), another cache: with its pods only.
	createRoute(t, selRoute("c", "tier in (b,c)"))
	waitKey(t, ns, "routes", routeKey("c"), others, sel5)
	keyC := informer.PodKey{Namespace: ns, Selector: "tier in (b,c)"}
	got := cachedPods(t, h.r.pods)
	if len(got) != 2 || !slices.Equal(got[keyA], want) || !slices.Equal(got[keyC], []string{ns + "/other-c", ns + "/sel-b"}) {
		t.Fatalf("pod caches hold %v, want %s: the 5, %s: other-c and sel-b", got, keyA, keyC)
	}

	// Pod events still reach the routes whose selectors match.
	pod(t, ns, "sel-5", map[string]string{"app": "sel", "tier": "a"}, "10.8.0.6", true, 8000)
	waitKey(t, ns, "routes", routeKey("a"), hosts("10.8.0.6"), others)
	waitKey(t, ns, "routes", routeKey("b"), hosts("10.8.0.6"), others)

	// Deleting b leaves a's cache (a still reads it); deleting c stops
	// c's after the idle delay.
	must(t, k8s.Delete(context.Background(), getRoute(t, ns, "b")))
	must(t, k8s.Delete(context.Background(), getRoute(t, ns, "c")))
	eventually(t, "the cache of c's selector to stop", func() (bool, string) {
		got := h.r.pods.Running()
		return slices.Equal(got, []informer.PodKey{keyA}), fmt.Sprint(got)
	})
	if h.r.pods.Synced()[keyA] != first {
		t.Fatal("the shared pod cache was restarted")
	}
	must(t, k8s.Delete(context.Background(), getRoute(t, ns, "a")))
	eventually(t, "every pod cache to stop", func() (bool, string) {
		got := h.r.pods.Running()
		return len(got) == 0, fmt.Sprint(got)
	})
}
