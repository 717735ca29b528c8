package controller

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TestInitialSyncWritesEachStatusOnce: routes no controller has reconciled
// yet, at a controller's start. The initial sync writes each route's status
// once: the workqueue's pass after it waits for the cache to show those
// writes, instead of reading the routes as they were and writing the same
// status (and event) again. And a first Ready at the start is no event of
// its own (the status says it); a Warning still is.
func TestInitialSyncWritesEachStatusOnce(t *testing.T) {
	ns := namespace(t, "initial")
	configMap(t, ns, "routes", nil, nil)
	const n = 40
	var names []types.NamespacedName
	for i := range n {
		name := fmt.Sprintf("r%d", i)
		service(t, ns, name, 8000)
		endpointSlice(t, ns, name+"-a", name, v4, 8000, up(fmt.Sprintf("10.11.%d.1", i)))
		createRoute(t, newRoute(ns, name, name))
		names = append(names, types.NamespacedName{Namespace: ns, Name: name})
	}
	// One route waits for a Service that does not exist: a Warning.
	createRoute(t, newRoute(ns, "missing", "missing"))

	base := reconciles(t)
	h := startManager(t, ns)
	for _, k := range names {
		waitCondition(t, ns, k.Name, metav1.ConditionTrue, ReasonReconciled)
	}
	waitCondition(t, ns, "missing", metav1.ConditionFalse, ReasonServiceNotFound)
	// Every route reconciled once more by the workers (the initial list).
	waitQuiet(t, h, base, nil, names...)
	if s := h.c.statusWrites.Load(); s != n+1 {
		t.Errorf("%d status writes for %d routes at start, want one each", s, n+1)
	}
	waitEvent(t, ns, "missing", ReasonServiceNotFound)
	time.Sleep(500 * time.Millisecond) // an event, if one were sent, would be listed by now
	var l eventsv1.EventList
	must(t, k8s.List(context.Background(), &l, client.InNamespace(ns)))
	for _, e := range l.Items {
		if e.Reason == ReasonReconciled {
			t.Errorf("event %s on %s at the start: %s", e.Reason, e.Regarding.Name, e.Note)
		}
	}
}

// TestInitialSyncInWaves: the initial sync reconciles the routes a wave at
// a time, in the order of their output ConfigMaps, instead of all at once
// (which kept every route's reconcile in memory until the last one reached
// its write). With waves of 10 and 10 routes in each of 3 ConfigMaps
// (created interleaved), each ConfigMap is written once or twice, and the
// routes of the last ConfigMap get their finalizer only after the first
// ConfigMap was written.
func TestInitialSyncInWaves(t *testing.T) {
	defer func(w int) { initialSyncWave = w }(initialSyncWave)
	initialSyncWave = 10
	ctx := context.Background()
	ns := namespace(t, "waves")
	cms := []string{"a", "b", "c"}
	for _, cm := range cms {
		configMap(t, ns, cm, nil, nil)
	}
	const n = 30
	cmOf := map[string]string{}
	for i := range n {
		name := fmt.Sprintf("r%02d", i)
		cmOf[name] = cms[i%3]
		service(t, ns, name, 8000)
		endpointSlice(t, ns, name+"-a", name, v4, 8000, up(fmt.Sprintf("10.12.%d.1", i)))
		createRoute(t, newRoute(ns, name, name, func(r *v1alpha1.ModelRoute) { r.Spec.Nginx.OutputConfigMap = cms[i%3] }))
	}
	// What the API server records, in resourceVersions (one etcd: one
	// sequence): each route's finalizer, each ConfigMap write.
	wc, err := client.NewWithWatch(testCfg, client.Options{Scheme: testScheme})
	must(t, err)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var l v1alpha1.ModelRouteList
	must(t, k8s.List(ctx, &l, client.InNamespace(ns)))
	rw, err := wc.Watch(wctx, &v1alpha1.ModelRouteList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: l.ResourceVersion}})
	must(t, err)
	defer rw.Stop()
	var cl corev1.ConfigMapList
	must(t, k8s.List(ctx, &cl, client.InNamespace(ns)))
	cw, err := wc.Watch(wctx, &corev1.ConfigMapList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: cl.ResourceVersion}})
	must(t, err)
	defer cw.Stop()
	var mu sync.Mutex
	finalized := map[string]string{} // route → resourceVersion of its finalizer
	written := map[string][]string{} // ConfigMap → resourceVersions of its writes
	go func() {
		for e := range rw.ResultChan() {
			if r, ok := e.Object.(*v1alpha1.ModelRoute); ok && slices.Contains(r.Finalizers, Finalizer) {
				mu.Lock()
				if _, seen := finalized[r.Name]; !seen {
					finalized[r.Name] = r.ResourceVersion
				}
				mu.Unlock()
			}
		}
	}()
	go func() {
		for e := range cw.ResultChan() {
			if c, ok := e.Object.(*corev1.ConfigMap); ok && e.Type == watch.Modified {
				mu.Lock()
				written[c.Name] = append(written[c.Name], c.ResourceVersion)
				mu.Unlock()
			}
		}
	}()

	base := reconciles(t)
	h := startManager(t, ns)
	var names []types.NamespacedName
	for i := range n {
		name := fmt.Sprintf("r%02d", i)
		waitCondition(t, ns, name, metav1.ConditionTrue, ReasonReconciled)
		names = append(names, types.NamespacedName{Namespace: ns, Name: name})
	}
	waitQuiet(t, h, base, nil, names...)
	// Once each; twice when a route's request reaches the writer just
	// after its wave's batch went out.
	if w := h.c.cmWrites.Load(); w > 2*int64(len(cms)) {
		t.Errorf("%d ConfigMap writes at the start, want at most two per ConfigMap (%d)", w, len(cms))
	}
	eventually(t, "every finalizer and ConfigMap write seen", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(finalized) == n && len(written["a"]) > 0, fmt.Sprint(len(finalized), written)
	})
	mu.Lock()
	defer mu.Unlock()
	firstA := written["a"][0]
	for name, rv := range finalized {
		if cmOf[name] != "c" {
			continue
		}
		if c, err := resourceversion.CompareResourceVersion(rv, firstA); err != nil || c < 0 {
			t.Errorf("route %s (ConfigMap c) got its finalizer at %s, before ConfigMap a was written (%s): not in waves (%v)", name, rv, firstA, err)
		}
	}
}

// TestInitialSyncBatchesConfigMapWrites: routes that exist when the
// controller starts are rendered by the initial sync with the ConfigMap
// writes held, so the routes sharing a ConfigMap reach it in a batch or
// two, not a write per few routes. 60 routes share 2 ConfigMaps; the
// ConfigMap writes are counted by a watch opened before the manager
// starts (MODIFIED events per ConfigMap).
//
// The bound: the initial sync releases the held writes when every route
// has reached its write (the last few may follow in a second batch), or
// after initialSyncHold; then the workqueue's pass writes nothing. Without
// it, the harness's 4 workers each wait in their route's write, so a
// batch holds at most 4 routes: 30 routes per ConfigMap need at least 8
// writes of it.
func TestInitialSyncBatchesConfigMapWrites(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := namespace(t, "initsync")
	cms := []string{"routes-a", "routes-b"}
	for _, cm := range cms {
		configMap(t, ns, cm, nil, nil)
	}
	const services, n = 6, 60
	for i := range services {
		svc := fmt.Sprintf("s%d", i)
		service(t, ns, svc, 8000)
		endpointSlice(t, ns, svc+"-a", svc, v4, 8000, up(fmt.Sprintf("10.29.%d.1", i), fmt.Sprintf("10.29.%d.2", i)))
	}
	var names []types.NamespacedName
	for i := range n {
		name := fmt.Sprintf("r%d", i)
		createRoute(t, newRoute(ns, name, fmt.Sprintf("s%d", i%services), func(r *v1alpha1.ModelRoute) {
			r.Spec.Nginx.OutputConfigMap = cms[i%len(cms)]
		}))
		names = append(names, types.NamespacedName{Namespace: ns, Name: name})
	}

	// The watch is open before the manager starts: it sees every write.
	wc, err := client.NewWithWatch(testCfg, client.Options{Scheme: testScheme})
	must(t, err)
	w, err := wc.Watch(ctx, &corev1.ConfigMapList{}, client.InNamespace(ns))
	must(t, err)
	var mu sync.Mutex
	writes := map[string]int{}
	lastRV := map[string]string{} // newest resourceVersion seen, per ConfigMap
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for ev := range w.ResultChan() {
			cm, ok := ev.Object.(*corev1.ConfigMap)
			if !ok {
				continue
			}
			mu.Lock()
			if ev.Type == watch.Modified {
				writes[cm.Name]++
			}
			lastRV[cm.Name] = cm.ResourceVersion
			mu.Unlock()
		}
	}()
	defer func() { w.Stop(); <-watchDone }()
	counts := func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string]int, len(writes))
		for k, v := range writes {
			out[k] = v
		}
		return out
	}
	seen := func(cm string) string {
		mu.Lock()
		defer mu.Unlock()
		return lastRV[cm]
	}

	base := reconciles(t)
	h := startManager(t, ns)
	for i := range n {
		s := i % services
		waitKey(t, ns, cms[i%len(cms)], routeKey(fmt.Sprintf("r%d", i)),
			[]string{host(fmt.Sprintf("10.29.%d.1", s)), host(fmt.Sprintf("10.29.%d.2", s))}, nil)
	}
	for _, nn := range names {
		waitCondition(t, ns, nn.Name, metav1.ConditionTrue, ReasonReconciled)
	}
	// Every route's reconciles (the initial sync's and the workqueue's
	// pass after it) have finished: the writes they make are in.
	waitQuiet(t, h, base, nil, names...)
	// The watch has delivered every write up to now: it has seen each
	// ConfigMap at the resourceVersion a read returns now.
	for _, cm := range cms {
		c, err := getCM(t, ns, cm)
		must(t, err)
		if len(c.Data) != n/len(cms) {
			t.Fatalf("%s holds %d keys, want %d", cm, len(c.Data), n/len(cms))
		}
		eventually(t, cm+" at resourceVersion "+c.ResourceVersion+" seen by the watch", func() (bool, string) {
			rv := seen(cm)
			return rv == c.ResourceVersion, "last seen " + rv
		})
	}
	got := counts()
	t.Logf("ConfigMap writes for %d routes (%d per ConfigMap): %v", n, n/len(cms), got)
	const bound = 5
	for _, cm := range cms {
		if got[cm] > bound {
			t.Errorf("%s written %d times for its %d routes; the initial sync should write it at most %d times", cm, got[cm], n/len(cms), bound)
		}
	}
}
