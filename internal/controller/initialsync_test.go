package controller

import (
	"context"
	"fmt"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

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
