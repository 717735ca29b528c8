package controller

import (
	"context"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// CacheOptions are the manager cache options the controller needs: managed
// fields and kubectl's last-applied copy stripped from everything and, when
// namespaces is not empty, namespaced objects cached only there (Nodes are
// cluster-scoped and always cached, metadata only; ConfigMaps metadata
// only). Pods are not in the manager's cache: they are cached per
// namespace and label selector, only the pods routes select (informer.PodCaches).
//
// A read of a kind the controller does not watch fails instead of starting
// a cache of it (ErrResourceNotCached): a typed ConfigMap read through the
// cache would otherwise cache every ConfigMap of the cluster in full.
func CacheOptions(namespaces []string) cache.Options {
	o := cache.Options{
		DefaultTransform:            stripUnread,
		ReaderFailOnMissingInformer: true,
	}
	if len(namespaces) > 0 {
		o.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			o.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	return o
}

// stripUnread drops from every cached object what the controller never
// reads and what is often its largest part: managed fields, and the copy
// of the whole object kubectl apply keeps in an annotation. EndpointSlices
// and Services, of which a cluster has about one per workload, are cut
// down to the fields the controller reads (discovery.StripEndpointSlice,
// stripService).
func stripUnread(o any) (any, error) {
	switch o := o.(type) {
	case *discoveryv1.EndpointSlice:
		return discovery.StripEndpointSlice(o)
	case *corev1.Service:
		return stripService(o), nil
	}
	if a, err := meta.Accessor(o); err == nil {
		if a.GetManagedFields() != nil { // as controller-runtime's TransformStripManagedFields
			a.SetManagedFields(nil)
		}
		if ann := a.GetAnnotations(); ann[corev1.LastAppliedConfigAnnotation] != "" {
			ann = maps.Clone(ann)
			delete(ann, corev1.LastAppliedConfigAnnotation)
			a.SetAnnotations(ann)
		}
	}
	return o, nil
}

// stripService keeps only what the controller reads of a Service:
// identity, owner references and deletion (whose fallback Service it is),
// the managed-by label and the fallback-for and allowed-route-namespaces
// annotations, and of the spec the type, selector, cluster IPs and ports
// (name, protocol, port, target port). Its status, the other labels and
// annotations and the rest of the spec (IP families, traffic policies,
// node ports, load balancer settings) are never read. The result is a new
// object: the transform may run again on a cached one (a resync).
func stripService(s *corev1.Service) *corev1.Service {
	out := &corev1.Service{
		TypeMeta: s.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name, Namespace: s.Namespace, UID: s.UID, ResourceVersion: s.ResourceVersion,
			DeletionTimestamp: s.DeletionTimestamp, OwnerReferences: s.OwnerReferences,
			Labels:      keep(s.Labels, ManagedByLabel),
			Annotations: keep(s.Annotations, FallbackForAnnotation, sink.AllowedNamespacesAnnotation),
		},
		Spec: corev1.ServiceSpec{
			Type: s.Spec.Type, Selector: s.Spec.Selector, ClusterIP: s.Spec.ClusterIP, ClusterIPs: s.Spec.ClusterIPs,
		},
	}
	if len(s.Spec.Ports) > 0 {
		out.Spec.Ports = make([]corev1.ServicePort, len(s.Spec.Ports))
		for i, p := range s.Spec.Ports {
			out.Spec.Ports[i] = corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, TargetPort: p.TargetPort}
		}
	}
	return out
}

// keep is the entries of m with the given keys (nil for none).
func keep(m map[string]string, keys ...string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keys))
			}
			out[k] = v
		}
	}
	return out
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
	r.cmChanges = newConfigMapChanges(r.changedKeys)
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
		WatchesMetadata(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(routes.MapNode), builder.WithPredicates(gpuLabelChanged())).
		WatchesMetadata(&corev1.ConfigMap{}, r.configMapHandler()).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(maxConcurrent, 1)})
	if r.Caches != nil {
		rs := &informer.Resync{Client: r.Client}
		r.Caches.OnCurrent(rs.QueueAll)
		b = b.WatchesRawSource(rs)
	}
	// One source for the events of every pod cache, started with the
	// controller: through MapPod, with podChanged dropping updates
	// discovery does not read, and through the consumer pods' handler.
	r.consumers = &consumers{client: r.Client, namespaces: r.Namespaces, routes: r.Routes} // its pods below
	pods, err := informer.NewPodCaches(mgr.GetConfig(), informer.PodCacheOptions{
		InUse: func(ctx context.Context) ([]informer.PodKey, error) { return podSelectors(ctx, r.Client, r.Namespaces) },
		Idle:  r.PodCacheIdle, Currency: r.Caches,
		Handler: podHandlers{selected: handler.EnqueueRequestsFromMapFunc(routes.MapPod), changed: podChanged(),
			consumers: r.consumers.podHandler()},
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

// podChanged drops pod updates that change nothing discovery reads (the
// pod caches keep records, so only the resourceVersion differs then): the
// two pods' records are compared, not their stripped pods rebuilt.
func podChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		pa, okA := e.ObjectOld.(*corev1.Pod)
		pb, okB := e.ObjectNew.(*corev1.Pod)
		if !okA || !okB {
			return true
		}
		return !discovery.CompactPod(pa).SameExceptVersion(discovery.CompactPod(pb))
	}}
}

// gpuLabelChanged passes node events that can change a gpuType: a new node,
// or a changed nvidia.com/gpu.product label. The nodes of the informer's
// first list (or, on a replica that starts leading, the nodes its cache
// already holds) are not new: each maps to the routes with endpoints on
// it, which the slice, Service and pod events of the same first lists
// queue anyway and the initial sync reconciles with the nodes' labels
// already cached. Mapping them scanned every EndpointSlice once per node
// (38 MB allocated and about 45,000 route lookups at start-up with 1000
// routes on 50 nodes) for nothing.
func gpuLabelChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return !e.IsInInitialList },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetLabels()[discovery.GPUProductLabel] != e.ObjectNew.GetLabels()[discovery.GPUProductLabel]
		},
		DeleteFunc: func(event.DeleteEvent) bool { return false },
	}
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
			r.cmChanges.add(ref, e.ObjectNew.GetResourceVersion(), q)
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
