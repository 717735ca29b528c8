package controller

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/internal/informer"
	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/internal/scaler"
	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// CacheCurrency is informer.CacheCurrency: whether every cache holds what
// the API server holds.
type CacheCurrency = informer.CacheCurrency

// NewCacheCurrency returns a CacheCurrency with no stale cache.
func NewCacheCurrency() *CacheCurrency { return informer.NewCacheCurrency() }

// CacheOptions are the manager cache options the controller needs
// (informer.CacheOptions): of Services, the labels and annotations it
// reads are kept (the managed-by label, the fallback-for and
// allowed-route-namespaces annotations).
func CacheOptions(namespaces []string) cache.Options {
	return informer.CacheOptions(namespaces, informer.ServiceFields{
		Labels:      []string{ManagedByLabel},
		Annotations: []string{FallbackForAnnotation, sink.AllowedNamespacesAnnotation},
	})
}

// SetupWithManager registers the field indexes and the controller with its
// watches. maxConcurrent is the number of parallel reconciles (0 = 1).
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, maxConcurrent int) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Routes == nil {
		r.Routes = NewRouteState()
	}
	r.scaler = &scaler.Scaler{Client: r.Client, Reader: r.APIReader}
	w := &sink.Writer{Client: r.Client, APIReader: r.APIReader, Trusted: r.TrustedNamespaces, Window: sink.DefaultBatchWindow}
	r.sink, r.out = w, w
	r.cmChanges = informer.NewConfigMapChanges(r.changedKeys)
	if err := mgr.Add(r.cmChanges); err != nil {
		return err
	}
	r.initial = newInitialSync(r)
	writeConflicts = func() float64 { return float64(w.Conflicts.Load()) }
	ix := informer.Indexer(mgr.GetCache())
	if err := discovery.SetupIndexes(ctx, ix); err != nil {
		return err
	}
	if err := SetupFallbackIndex(ctx, ix); err != nil {
		return err
	}
	if err := SetupOwnershipIndex(ctx, ix); err != nil {
		return err
	}
	routes := &informer.Routes{Client: r.Client} // its Pods below
	// mapService maps a Service to the routes that reference it and to
	// the selector route whose fallback Service has its name (ours or a
	// foreign one: its deletion lets the route create its own).
	mapService := func(ctx context.Context, o client.Object) []reconcile.Request {
		ref := o.GetNamespace() + "/" + o.GetName()
		return append(informer.Requests(routes.By(ctx, discovery.IndexRouteService, ref)),
			informer.Requests(routes.By(ctx, IndexRouteFallbackService, ref))...)
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named(Name).
		For(&v1alpha1.ModelRoute{}, builder.WithPredicates(routeChanged())).
		Watches(&v1alpha1.ModelRoute{}, handler.EnqueueRequestsFromMapFunc(r.mapClaimants), builder.WithPredicates(claimsChanged())).
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(routes.MapSlice)).
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(mapService)).
		WatchesMetadata(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(routes.MapNode), builder.WithPredicates(informer.GPULabelChanged())).
		WatchesMetadata(&corev1.ConfigMap{}, r.configMapHandler()).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(maxConcurrent, 1)})
	if r.Caches != nil {
		rs := &informer.Resync{Client: r.Client}
		r.Caches.OnCurrent(rs.QueueAll)
		b = b.WatchesRawSource(rs)
	}
	// One source for the events of every pod cache, started with the
	// controller: through MapPod, for the updates discovery reads, and
	// through the consumer pods' handler.
	r.consumers = &consumers{client: r.Client, namespaces: r.Namespaces, routes: r.Routes} // its pods below
	pods, err := informer.NewPodCaches(mgr.GetConfig(), informer.PodCacheOptions{
		InUse: func(ctx context.Context) ([]informer.PodKey, error) { return podSelectors(ctx, r.Client, r.Namespaces) },
		Idle:  r.PodCacheIdle, Currency: r.Caches,
		Selected: handler.EnqueueRequestsFromMapFunc(routes.MapPod), Every: r.consumers.podHandler(),
	})
	if err != nil {
		return err
	}
	r.pods, routes.Pods = pods, pods
	read := podReader(pods, r.Client)
	r.discovery = &discovery.Reader{Client: r.Client, Pods: read}
	r.consumers.pods = read
	r.fallback = &fallbackService{client: r.Client, apiReader: r.APIReader, recorder: r.Recorder, pods: read}
	b = b.WatchesRawSource(pods.Events())
	if _, err := b.Build(r); err != nil {
		return err
	}
	return mgr.Add(pods)
}

// routeChanged passes spec changes (generation), the start of deletion and
// a change of the adopt-foreign-keys annotation; our own status and
// finalizer patches do not re-trigger a reconcile.
func routeChanged() predicate.Predicate {
	return predicate.Or(predicate.GenerationChangedPredicate{}, predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero() ||
				e.ObjectOld.GetAnnotations()[AdoptForeignKeysAnnotation] != e.ObjectNew.GetAnnotations()[AdoptForeignKeysAnnotation]
		},
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	})
}

// claimsChanged passes the route events that can change who owns a key:
// creation, deletion (and its start), a spec change.
func claimsChanged() predicate.Predicate {
	return predicate.Or(predicate.GenerationChangedPredicate{}, predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	})
}

// mapClaimants maps a route to the other routes that render one of its
// keys: when it goes away or renders other keys, the next claimant takes
// the key over (for an update, both the old and the new object's keys are
// mapped); and to the routes whose monitor file goes into its nginx output
// ConfigMap.
func (r *Reconciler) mapClaimants(ctx context.Context, o client.Object) []reconcile.Request {
	rt, ok := o.(*v1alpha1.ModelRoute)
	if !ok {
		return nil
	}
	var out []reconcile.Request
	seen := map[types.NamespacedName]bool{client.ObjectKeyFromObject(rt): true}
	add := func(routes []v1alpha1.ModelRoute) {
		for i := range routes {
			if k := client.ObjectKeyFromObject(&routes[i]); !seen[k] {
				seen[k] = true
				out = append(out, reconcile.Request{NamespacedName: k})
			}
		}
	}
	for _, v := range outputKeyValues(rt) {
		add(informer.RoutesBy(ctx, r.Client, IndexRouteOutputKey, v))
	}
	// Routes whose monitor file goes where this route writes nginx files.
	if cm := rt.Spec.Nginx.OutputConfigMap; cm != "" {
		add(informer.RoutesBy(ctx, r.Client, IndexRouteMonitorConfigMap, compiler.ResolveRef(compilerRoute(rt), cm)))
	}
	return out
}

// configMapHandler re-renders routes on output ConfigMap events (metadata
// only: the controller does not cache ConfigMaps, see sink's content.go):
// all referencing routes when it appears, disappears or its
// allowed-route-namespaces or dynamic-peers annotation changes; otherwise the routes waiting
// on it (too large, a key held by another) and the routes whose own keys
// changed — someone edited them, or the CART chart changed the base config
// — which the writer tells (Seen: our own writes it knows, another
// writer's version it reads once), so one route's write does not re-render
// its neighbours.
func (r *Reconciler) configMapHandler() handler.EventHandler {
	all := func(ctx context.Context, o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		for _, req := range informer.Requests(informer.RoutesBy(ctx, r.Client, discovery.IndexRouteConfigMap, o.GetNamespace()+"/"+o.GetName())) {
			q.Add(req)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			all(ctx, e.Object, q)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.sink.Forget(e.Object.GetNamespace() + "/" + e.Object.GetName())
			all(ctx, e.Object, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.ObjectOld.GetAnnotations()[sink.AllowedNamespacesAnnotation] != e.ObjectNew.GetAnnotations()[sink.AllowedNamespacesAnnotation] ||
				e.ObjectOld.GetAnnotations()[peers.Annotation] != e.ObjectNew.GetAnnotations()[peers.Annotation] {
				all(ctx, e.ObjectNew, q)
				return
			}
			if e.ObjectOld.GetResourceVersion() == e.ObjectNew.GetResourceVersion() {
				return // a resync
			}
			ref := e.ObjectNew.GetNamespace() + "/" + e.ObjectNew.GetName()
			for _, key := range r.Routes.waiting.on(ref) {
				q.Add(reconcile.Request{NamespacedName: key})
			}
			// Which routes' keys changed is asked of the writer, which
			// waits for a write of this ConfigMap in flight and may read
			// it: not in the informer's goroutine, but in the ConfigMap
			// queue's (one pass per ConfigMap, however many events).
			r.cmChanges.Add(ref, e.ObjectNew.GetResourceVersion(), q)
		},
	}
}

// changedKeys queues the routes whose keys in ref changed, as the writer
// tells at resourceVersion rv, other than by their own writes.
func (r *Reconciler) changedKeys(ctx context.Context, ref, rv string, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	ch, err := r.sink.Seen(ctx, ref, rv)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "read a changed configmap; re-rendering its routes", "configmap", ref)
		ch.All = true
	}
	for _, rt := range informer.RoutesBy(ctx, r.Client, discovery.IndexRouteConfigMap, ref) {
		key := client.ObjectKeyFromObject(&rt)
		owned, known := r.Routes.rendered.get(key)
		if ch.All || (!known && len(ch.Keys) > 0) || slices.ContainsFunc(owned[ref], func(k string) bool {
			v, changed := ch.Keys[k]
			// The route's own write is not a change to react to.
			return changed && !(v != nil && r.Routes.rendered.ownValue(key, ref, k, *v))
		}) {
			q.Add(reconcile.Request{NamespacedName: key})
		}
	}
}
