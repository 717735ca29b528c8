package controller

// This file: what the controller remembers between reconciles, per route.
// Every registry lives in RouteState, which the Reconciler is given (one
// per process; a preview gets its own, thrown away), and Forget drops a
// route from all of them at once.

import (
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/modelsphere/autoconfig/internal/sink"
)

// RouteState is the controller's memory of its routes between reconciles:
// the validated spec per generation, the keys each route last rendered and
// what they hold, the ConfigMaps a route waits on, the backends of its
// last write (for the change log), the consumers' convergence clocks and
// the parsed served reports. None of it is needed for correctness after a
// restart (status and the ConfigMaps hold the truth); it saves work and
// tells a route's own writes from other writers'.
type RouteState struct {
	specs    specCache
	rendered renderedKeys
	waiting  waitSet
	changes  changeLog
	applied  appliedTracker
	reports  reportCache
	writes   routeWrites
}

// NewRouteState returns an empty RouteState.
func NewRouteState() *RouteState { return &RouteState{} }

// Forget drops everything remembered about a route that is gone, and its
// metric series.
func (s *RouteState) Forget(key types.NamespacedName) {
	s.specs.forgetName(key)
	s.rendered.set(key, nil)
	s.waiting.set(key, nil)
	s.changes.forget(key)
	s.applied.forget(key)
	s.writes.set(key, "")
	routeSeries.Forget(key)
}

// renderedKeys remembers the keys each route last rendered (ConfigMap →
// keys), so a ConfigMap event re-renders only the routes whose keys
// changed, and keys a route stops rendering (renamed route, moved output)
// are removed. (Who may write a key at all is ownership.go's business.)
type renderedKeys struct {
	mu sync.Mutex
	m  map[types.NamespacedName]map[string][]string
	// sums: what each of the route's keys held after its last write
	// ("ns/name\x00key" → SHA-256), so the event of its own write is not
	// taken for a change.
	sums map[types.NamespacedName]map[string]sink.Sum
}

// setSums records what the route's keys in cm hold (or are about to hold)
// after a write.
func (o *renderedKeys) setSums(key types.NamespacedName, cm string, sums map[string]sink.Sum) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.sums == nil {
		o.sums = map[types.NamespacedName]map[string]sink.Sum{}
	}
	m := o.sums[key]
	if m == nil {
		m = map[string]sink.Sum{}
		o.sums[key] = m
	}
	for k := range m {
		if strings.HasPrefix(k, cm+"\x00") {
			delete(m, k)
		}
	}
	for k, s := range sums {
		m[cm+"\x00"+k] = s
	}
}

// sumsIn are the Sums of the route's keys in cm as last decided.
func (o *renderedKeys) sumsIn(key types.NamespacedName, cm string) map[string]sink.Sum {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]sink.Sum{}
	for k, s := range o.sums[key] {
		if c, name, ok := strings.Cut(k, "\x00"); ok && c == cm {
			out[name] = s
		}
	}
	return out
}

// keysIn are the route's keys in cm.
func (o *renderedKeys) keysIn(key types.NamespacedName, cm string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.m[key][cm])
}

// ownValue reports whether value is what the route itself last left in
// cm's key.
func (o *renderedKeys) ownValue(key types.NamespacedName, cm, k, value string) bool {
	o.mu.Lock()
	s, ok := o.sums[key][cm+"\x00"+k]
	o.mu.Unlock()
	return ok && s == sink.SumOf(value)
}

func (o *renderedKeys) get(key types.NamespacedName) (map[string][]string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	v, ok := o.m[key]
	return v, ok
}

func (o *renderedKeys) set(key types.NamespacedName, v map[string][]string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if v == nil {
		delete(o.m, key)
		delete(o.sums, key)
		return
	}
	if o.m == nil {
		o.m = map[types.NamespacedName]map[string][]string{}
	}
	o.m[key] = v
}

// waitSet remembers the routes that wait on a ConfigMap's content without
// owning a key that changes (too large, a key held by another route or by
// hand), so any change to that ConfigMap re-renders them.
type waitSet struct {
	mu sync.Mutex
	m  map[string]map[types.NamespacedName]bool // ConfigMap ns/name → routes
}

// set makes route wait on exactly cms.
func (w *waitSet) set(route types.NamespacedName, cms []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for cm, routes := range w.m {
		if routes[route] && !slices.Contains(cms, cm) {
			delete(routes, route)
			if len(routes) == 0 {
				delete(w.m, cm)
			}
		}
	}
	for _, cm := range cms {
		if w.m == nil {
			w.m = map[string]map[types.NamespacedName]bool{}
		}
		if w.m[cm] == nil {
			w.m[cm] = map[types.NamespacedName]bool{}
		}
		w.m[cm][route] = true
	}
}

// on lists the routes waiting on cm.
func (w *waitSet) on(cm string) []types.NamespacedName {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]types.NamespacedName, 0, len(w.m[cm]))
	for r := range w.m[cm] {
		out = append(out, r)
	}
	return out
}

// routeWrites remembers, per route, the resourceVersion our last write of
// the route (finalizer, status) produced, or the newest one a read around
// the cache returned. The cache learns of that write a moment later: a
// reconcile in between would read the route as it was before it, and a
// status patch computed against that stale copy leaves out every field
// the stale copy already shows as wanted, however the live route differs
// (Applied True over a live Synced 0/1 that stayed). A cached route
// with another resourceVersion is read around the cache (currentRoute).
type routeWrites struct {
	mu sync.Mutex
	m  map[types.NamespacedName]string
}

// get is the resourceVersion recorded for route ("" for none).
func (w *routeWrites) get(route types.NamespacedName) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.m[route]
}

// set records rv for route; "" forgets it.
func (w *routeWrites) set(route types.NamespacedName, rv string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if rv == "" {
		delete(w.m, route)
		return
	}
	if w.m == nil {
		w.m = map[types.NamespacedName]string{}
	}
	w.m[route] = rv
}
