package informer

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/internal/testenv"
)

// cachedPods are the pods ("ns/name", sorted) each running pod cache
// holds (a List of the cache without selector: its informer's whole
// store), what the controller keeps in memory.
func cachedPods(t testing.TB, p *PodCaches) map[PodKey][]string {
	t.Helper()
	out := map[PodKey][]string{}
	for k, e := range p.synced() {
		out[k] = testenv.PodKeys(t, e.cache)
	}
	return out
}

// createPods creates n Deployment-shaped pods, with ips running and
// Ready (testenv.CreatePods).
func createPods(t testing.TB, ns, prefix string, n int, labels map[string]string, ips ...int) {
	t.Helper()
	testenv.CreatePods(t, k8s, ns, prefix, n, labels, ips...)
}

// TestPodCacheHeap measures what a pod cache keeps: POD_CACHE_HEAP=1 runs
// it (creating 2000 pods takes a while). A namespace of 2000 pods, a
// selector matching 1 % of them: the heap (after GC) of a cache of the
// whole namespace, as the controller kept before, against the cache of
// the selector.
//
//	POD_CACHE_HEAP=1 go test -run TestPodCacheHeap -v ./internal/informer/
func TestPodCacheHeap(t *testing.T) {
	if v, _ := strconv.ParseBool(os.Getenv("POD_CACHE_HEAP")); !v {
		t.Skip("set POD_CACHE_HEAP=1 to measure")
	}
	const n, matched = 2000, 20
	ns := namespace(t, "podheap")
	createPods(t, ns, "noise", n-matched, map[string]string{"app": "noise"}, 64)
	createPods(t, ns, "sel", matched, map[string]string{"app": "sel"}, 65)

	// Shared by the caches, as in the controller.
	hc, err := podCachesClient(testCfg)
	must(t, err)
	for _, shape := range []struct{ name, sel string }{
		// The small ones first: what is left of a stopped cache is
		// then small too. A selector matching nothing is the cost of
		// a cache without pods (its watcher, map and watch).
		{"selector matching none", "app=none"},
		{"selector app=sel, 1% (after)", "app=sel"},
		{"whole namespace (before)", ""},
	} {
		p := &PodCaches{cfg: testCfg, httpClient: hc, idle: time.Minute}
		before, gBefore, sBefore := testbin.HeapAfterGC(), runtime.NumGoroutine(), stackInuse()
		if _, err := p.Reader(context.Background(), ns, shape.sel); err != nil {
			t.Fatal(err)
		}
		after, gAfter, sAfter := testbin.HeapAfterGC(), runtime.NumGoroutine(), stackInuse()
		held := 0
		for _, keys := range cachedPods(t, p) {
			held += len(keys)
		}
		t.Logf("%s: %d of %d pods cached, heap +%d KiB, %d goroutines (stacks +%d KiB)", shape.name, held, n,
			(after-before)/1024, gAfter-gBefore, (int64(sAfter)-int64(sBefore))/1024)
		p.mu.Lock()
		for _, e := range p.byKey {
			e.stop()
		}
		p.mu.Unlock()
		time.Sleep(time.Second) // its goroutines end: not freed during the next
	}
}

// stackInuse is the memory of the goroutines' stacks.
func stackInuse() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.StackInuse
}
