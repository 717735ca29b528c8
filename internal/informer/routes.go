package informer

// This file: the routes an object concerns, looked up through the field
// indexes (Indexer): the event mapping of EndpointSlices, pods and Nodes.

import (
	"context"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// Routes maps objects to the routes they concern, through the field
// indexes of Client (the manager's cache) and the pods of Pods.
type Routes struct {
	Client client.Reader
	// Pods are the pod caches (nil: none, in tests without a manager).
	Pods *PodCaches
}

// By lists the routes whose index holds value (RoutesBy).
func (rs *Routes) By(ctx context.Context, index, value string) []v1alpha1.ModelRoute {
	return RoutesBy(ctx, rs.Client, index, value)
}

// RoutesBy lists the routes of c whose index holds value. The routes are
// the cache's own objects: callers must not modify them.
func RoutesBy(ctx context.Context, c client.Reader, index, value string) []v1alpha1.ModelRoute {
	var l v1alpha1.ModelRouteList
	// Read-only use: the cache's objects are not copied (a ConfigMap event
	// of a ConfigMap shared by 100 routes used to deep-copy all of them).
	if err := c.List(ctx, &l, client.MatchingFields{index: value}, client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "list routes by index", "index", index, "value", value)
		return nil
	}
	return l.Items
}

// Requests are the reconcile requests of routes.
func Requests(routes []v1alpha1.ModelRoute) []reconcile.Request {
	out := make([]reconcile.Request, len(routes))
	for i := range routes {
		out[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&routes[i])}
	}
	return out
}

// MapSlice maps an EndpointSlice to the routes that reference its Service.
func (rs *Routes) MapSlice(ctx context.Context, o client.Object) []reconcile.Request {
	svc := o.GetLabels()[discoveryv1.LabelServiceName]
	if svc == "" {
		return nil
	}
	return Requests(rs.By(ctx, discovery.IndexRouteService, o.GetNamespace()+"/"+svc))
}

// MapPod maps a pod to the selector routes of its namespace whose selectors
// match it (the index narrows to one namespace's selector routes).
func (rs *Routes) MapPod(ctx context.Context, o client.Object) []reconcile.Request {
	var out []reconcile.Request
	set := labels.Set(o.GetLabels())
	for _, rt := range rs.By(ctx, discovery.IndexRouteSelectorNamespace, o.GetNamespace()) {
		for _, s := range discovery.RouteSelectors(&rt) {
			if sel, err := parsedSelector(s); err == nil && sel.Matches(set) {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&rt)})
				break
			}
		}
	}
	return out
}

// selectors holds parsed route selectors (string → labels.Selector):
// MapPod matches every pod event against the selectors of its namespace's
// routes, and parsing them anew for each allocated 17 MB in a 1000-route
// start-up. Bounded by the distinct selectors routes have had; cleared
// when it grows past maxParsedSelectors.
var (
	selectorsMu sync.Mutex
	selectors   = map[string]labels.Selector{}
)

const maxParsedSelectors = 10000

// parsedSelector is labels.Parse(s), parsed once.
func parsedSelector(s string) (labels.Selector, error) {
	selectorsMu.Lock()
	sel, ok := selectors[s]
	selectorsMu.Unlock()
	if ok {
		return sel, nil
	}
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, err
	}
	selectorsMu.Lock()
	if len(selectors) >= maxParsedSelectors {
		clear(selectors)
	}
	selectors[s] = sel
	selectorsMu.Unlock()
	return sel, nil
}

// MapNode maps a node to the routes with endpoints on it: through the
// slices and pods on that node.
func (rs *Routes) MapNode(ctx context.Context, o client.Object) []reconcile.Request {
	node := o.GetName()
	seen := map[types.NamespacedName]bool{}
	var out []reconcile.Request
	add := func(reqs []reconcile.Request) {
		for _, q := range reqs {
			if !seen[q.NamespacedName] {
				seen[q.NamespacedName] = true
				out = append(out, q)
			}
		}
	}
	// Read-only, and one lookup per Service: a node carries endpoints of
	// most slices, and each node's creation at start-up deep-copied all
	// of them (57 MB allocated for 50 nodes and 900 slices). Every slice
	// is scanned, not looked up in an index by node: that index held a
	// key per node of every slice (0.8–2.4 MB of live heap in profiles at
	// 10,000 endpoints on 50 nodes) for events as rare as a node joining
	// or its GPU label changing.
	var sl discoveryv1.EndpointSliceList
	if err := rs.Client.List(ctx, &sl, client.UnsafeDisableDeepCopy); err == nil {
		services := map[string]bool{}
		for i := range sl.Items {
			s := &sl.Items[i]
			if !slices.ContainsFunc(s.Endpoints, func(ep discoveryv1.Endpoint) bool {
				return ep.NodeName != nil && *ep.NodeName == node
			}) {
				continue
			}
			svc := s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
			if services[svc] {
				continue
			}
			services[svc] = true
			add(rs.MapSlice(ctx, s))
		}
	}
	if rs.Pods != nil {
		for _, pr := range rs.Pods.Synced() {
			// No index by node: the caches hold only selected pods, and
			// a GPU label change is rare; an index per cache cost a set
			// per node and cache.
			var pl corev1.PodList
			if err := pr.List(ctx, &pl, client.UnsafeDisableDeepCopy); err == nil {
				for i := range pl.Items {
					if pl.Items[i].Spec.NodeName == node {
						add(rs.MapPod(ctx, &pl.Items[i]))
					}
				}
			}
		}
	}
	return out
}

// GPULabelChanged passes node events that can change a gpuType: a new node,
// or a changed nvidia.com/gpu.product label. The nodes of the informer's
// first list (or, on a replica that starts leading, the nodes its cache
// already holds) are not new: each maps to the routes with endpoints on
// it, which the slice, Service and pod events of the same first lists
// queue anyway and the initial sync reconciles with the nodes' labels
// already cached. Mapping them scanned every EndpointSlice once per node
// (38 MB allocated and about 45,000 route lookups at start-up with 1000
// routes on 50 nodes) for nothing.
func GPULabelChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return !e.IsInInitialList },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetLabels()[discovery.GPUProductLabel] != e.ObjectNew.GetLabels()[discovery.GPUProductLabel]
		},
		DeleteFunc: func(event.DeleteEvent) bool { return false },
	}
}
