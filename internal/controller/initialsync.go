package controller

// This file: the initial sync. When the controller starts leading, every
// route is reconciled at once, and the ConfigMap writes are held until
// each route has reached its write (or initialSyncHold has passed), so each
// ConfigMap is written once for all its routes instead of once per few
// routes (a thousand routes in ten ConfigMaps used to write each of them
// 40–67 times, and one watcher of them received 90 MB). It starts with the
// first Reconcile call (on the leader, once the controller's informers have
// synced); the workqueue's workers wait for it, then reconcile every route
// once more as usual, which finds everything current and writes nothing.

import (
	"context"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// initialSyncHold bounds how long the initial sync holds the ConfigMap
// writes for routes that have not reached their write yet (a slow read, a
// client rate limit): after it, each write goes out as it comes.
const initialSyncHold = 5 * time.Second

// initialSyncCacheWait bounds how long the initial sync waits for the
// cache to show its own writes of the routes (awaitCache).
const initialSyncCacheWait = 5 * time.Second

// initialSync reconciles every route once when the controller starts
// leading. It starts with the first Reconcile call: by then the
// controller's sources (the informers every step reads) have synced.
type initialSync struct {
	r *Reconciler
	// done is closed when the initial sync is over.
	done chan struct{}
	once sync.Once
}

// initialSyncWave is how many routes the initial sync reconciles at once,
// in the order of their output ConfigMaps; each wave's writes are held
// until its routes have reached them. Every route at once kept a
// thousand reconciles (their goroutines, their renderings) in memory until
// the ConfigMaps were written: most of the controller's peak at 1000
// routes. In waves of 200, a ConfigMap of 100 routes is still written once
// or twice, and one that every route writes (a shared monitor ConfigMap)
// once per wave: 5 times at 1000 routes.
var initialSyncWave = 200 // a variable for the tests

// syncWave is one wave of the initial sync.
type syncWave struct {
	mu      sync.Mutex
	waiting int // routes that have not reached their write nor ended
	release func()
}

func newInitialSync(r *Reconciler) *initialSync {
	return &initialSync{r: r, done: make(chan struct{})}
}

// begin starts the initial sync, once, in the background.
func (s *initialSync) begin(ctx context.Context) {
	if s == nil {
		return
	}
	s.once.Do(func() { go s.run(ctx) })
}

// run reconciles every route of the cache, a wave at a time, the writes
// of each wave held.
func (s *initialSync) run(ctx context.Context) {
	defer close(s.done)
	// Read-only: only each route's key and output ConfigMap are kept (a
	// deep copy of every route stayed live through the whole sync).
	var l v1alpha1.ModelRouteList
	if err := s.r.Client.List(ctx, &l, client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "initial sync: list routes; the workqueue reconciles them one by one")
		return
	}
	if len(l.Items) == 0 {
		return
	}
	start := time.Now()
	// The routes of one ConfigMap together, so that a wave writes it once.
	type entry struct {
		order string
		key   client.ObjectKey
	}
	entries := make([]entry, len(l.Items))
	for i := range l.Items {
		rt := &l.Items[i]
		entries[i] = entry{compiler.ResolveRef(compilerRoute(rt), rt.Spec.Nginx.OutputConfigMap) + "\x00" + rt.Namespace + "/" + rt.Name, client.ObjectKeyFromObject(rt)}
	}
	l.Items = nil
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.order, b.order) })
	keys := make([]client.ObjectKey, len(entries))
	for i := range entries {
		keys[i] = entries[i].key
	}
	entries = nil
	ctx = context.WithValue(ctx, initialSyncKey{}, true)
	rvs := make([]string, len(keys))
	var all sync.WaitGroup
	for first := 0; first < len(keys); first += initialSyncWave {
		last := min(first+initialSyncWave, len(keys))
		w := &syncWave{waiting: last - first}
		if s.r.sink != nil {
			w.release = s.r.sink.Hold(initialSyncHold)
		}
		var wg sync.WaitGroup
		for i := first; i < last; i++ {
			key := keys[i]
			all.Add(1)
			wg.Go(func() {
				defer all.Done()
				var once sync.Once
				arrive := func() { once.Do(w.arrived) }
				_, err := s.r.reconcileRV(ctx, key, arrive, &rvs[i])
				initialSyncReconciles.Inc()
				if err != nil {
					ctrl.Log.WithName(Name).V(levelDebug).Info("initial sync: reconcile failed; the workqueue retries it", "route", key.String(), "err", err.Error())
				}
				arrive()
			})
		}
		// The next wave's hold must not hold this wave's writes: wait for
		// its routes, but not for one stuck much longer than the hold.
		wait := make(chan struct{})
		go func() { wg.Wait(); close(wait) }()
		t := time.NewTimer(2 * initialSyncHold)
		select {
		case <-wait:
		case <-t.C:
		}
		t.Stop()
		if w.release != nil {
			w.release()
		}
	}
	all.Wait()
	behind := s.awaitCache(ctx, keys, rvs)
	// The sync's transient heap is garbage now; return it to the OS
	// instead of keeping it resident until the runtime's background
	// scavenger gets to it.
	debug.FreeOSMemory()
	ctrl.Log.WithName(Name).Info("initial sync done", "routes", len(keys), "seconds", time.Since(start).Seconds(), "routesCacheBehind", behind)
}

// awaitCache waits (at most initialSyncCacheWait) until the cache shows
// the routes' resourceVersions rvs, the ones their reconciles' own writes
// (finalizer, status) left: the workers then reconcile every route once
// more, and one that still read the route as it was before its status
// write would find the status changed and write it (and its event)
// again; at 1000 routes, about 400 did. It returns how many routes the
// cache still showed older.
func (s *initialSync) awaitCache(ctx context.Context, keys []client.ObjectKey, rvs []string) int {
	deadline := time.Now().Add(initialSyncCacheWait)
	for {
		var l v1alpha1.ModelRouteList
		behind := 0
		if err := s.r.Client.List(ctx, &l, client.UnsafeDisableDeepCopy); err == nil {
			cached := make(map[client.ObjectKey]string, len(l.Items))
			for i := range l.Items {
				cached[client.ObjectKeyFromObject(&l.Items[i])] = l.Items[i].ResourceVersion
			}
			for i, want := range rvs {
				got, ok := cached[keys[i]]
				if want == "" || !ok || got == want {
					continue // gone, or as written
				}
				if c, err := resourceversion.CompareResourceVersion(got, want); err == nil && c < 0 {
					behind++
				}
			}
		} else {
			behind = len(rvs)
		}
		if behind == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return behind
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// arrived notes that one route of the wave has reached its write (or
// ended without one); the last one releases the wave's held writes.
func (w *syncWave) arrived() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiting--
	if w.waiting == 0 && w.release != nil {
		w.release()
	}
}

// wait blocks until the initial sync is over (or ctx ends).
func (s *initialSync) wait(ctx context.Context) {
	if s == nil {
		return
	}
	select {
	case <-s.done:
	case <-ctx.Done():
	}
}

type initialSyncKey struct{}

// inInitialSync tells a reconcile of the initial sync.
func inInitialSync(ctx context.Context) bool {
	v, _ := ctx.Value(initialSyncKey{}).(bool)
	return v
}

// firstReady: the route had no Ready condition (no controller ever
// reported it) and is Ready now. The initial sync sends no event for it:
// at the first start over existing routes, that was an event per route
// (1000 of the 3,900 requests of a cold start at 1000 routes) saying what
// the status says. Warnings, and changes of a Ready reported before, are
// still events.
func firstReady(orig, route *v1alpha1.ModelRoute) bool {
	after := meta.FindStatusCondition(route.Status.Conditions, TypeReady)
	return meta.FindStatusCondition(orig.Status.Conditions, TypeReady) == nil &&
		after != nil && after.Status == metav1.ConditionTrue
}
