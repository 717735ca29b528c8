package discovery

import (
	"context"
	"fmt"
	"github.com/modelsphere/autoconfig/schema/routespec"
	"slices"

	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// Field index keys registered on the manager's cache. Events on watched
// objects are mapped to the ModelRoutes they affect through these indexes,
// never by listing every route and filtering.
const (
	// IndexSliceService indexes EndpointSlices by "ns/service" (from the
	// kubernetes.io/service-name label).
	IndexSliceService = "discovery.routing.modelsphere.dev/service"
	// IndexRouteService indexes ModelRoutes by every Service they reference
	// ("ns/name": discovery, cart and nginx entry).
	IndexRouteService = "route.routing.modelsphere.dev/service"
	// IndexRouteConfigMap indexes ModelRoutes by every output ConfigMap
	// they write ("ns/name").
	IndexRouteConfigMap = "route.routing.modelsphere.dev/configmap"
	// IndexRouteSelectorNamespace indexes ModelRoutes that discover pods by
	// label selector, by the namespace the pods are listed in.
	IndexRouteSelectorNamespace = "route.routing.modelsphere.dev/selector-namespace"
)

// RouteServices returns the "ns/name" of every Service a route references.
func RouteServices(r *v1alpha1.ModelRoute) []string {
	refs := []string{r.Spec.Discovery.Service}
	if r.Spec.Cart != nil {
		refs = append(refs, r.Spec.Cart.Service)
	}
	if r.Spec.Canary != nil {
		refs = append(refs, r.Spec.Canary.Discovery.Service)
	}
	return uniqueKeys(r.Namespace, append(refs, r.Spec.Nginx.Service)...)
}

// RouteConfigMaps returns the "ns/name" of every output ConfigMap a route
// writes.
func RouteConfigMaps(r *v1alpha1.ModelRoute) []string {
	refs := []string{r.Spec.Nginx.OutputConfigMap}
	if r.Spec.Cart != nil {
		refs = append(refs, r.Spec.Cart.OutputConfigMap)
	}
	if r.Spec.Monitor != nil {
		refs = append(refs, r.Spec.Monitor.OutputConfigMap)
	}
	return uniqueKeys(r.Namespace, refs...)
}

// uniqueKeys resolves each non-empty reference against ns ("ns/name") and
// drops duplicates, keeping the first occurrence's order.
func uniqueKeys(ns string, refs ...string) []string {
	var out []string
	for _, ref := range refs {
		if ref == "" {
			continue
		}
		if k := routespec.RefKey(ref, ns); !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// RouteSelectors returns the route's pod label selectors (discovery, cart,
// nginx entry, canary). Selector pods are listed in the route's namespace.
func RouteSelectors(r *v1alpha1.ModelRoute) []string {
	var out []string
	if s := r.Spec.Discovery.Selector; s != "" && r.Spec.Discovery.Service == "" {
		out = append(out, s)
	}
	if c := r.Spec.Cart; c != nil && c.Selector != "" && c.Service == "" {
		out = append(out, c.Selector)
	}
	if s := r.Spec.Nginx.Selector; s != "" && r.Spec.Nginx.Service == "" {
		out = append(out, s)
	}
	if c := r.Spec.Canary; c != nil && c.Discovery.Selector != "" && c.Discovery.Service == "" && !slices.Contains(out, c.Discovery.Selector) {
		out = append(out, c.Discovery.Selector)
	}
	return out
}

// Index is one field index: the key, the object kind it indexes and the
// function computing an object's values.
type Index struct {
	Object client.Object
	Key    string
	Func   client.IndexerFunc
}

// Indexes are the field indexes the controller's cache carries (all of the
// keys above). IndexedReader evaluates the same functions
// over live lists, so the CLI finds what the controller finds.
func Indexes() []Index {
	return []Index{
		{&discoveryv1.EndpointSlice{}, IndexSliceService, func(o client.Object) []string {
			svc := o.GetLabels()[discoveryv1.LabelServiceName]
			if svc == "" {
				return nil
			}
			return []string{o.GetNamespace() + "/" + svc}
		}},
		{&v1alpha1.ModelRoute{}, IndexRouteService, func(o client.Object) []string {
			return RouteServices(o.(*v1alpha1.ModelRoute))
		}},
		{&v1alpha1.ModelRoute{}, IndexRouteConfigMap, func(o client.Object) []string {
			return RouteConfigMaps(o.(*v1alpha1.ModelRoute))
		}},
		{&v1alpha1.ModelRoute{}, IndexRouteSelectorNamespace, func(o client.Object) []string {
			if len(RouteSelectors(o.(*v1alpha1.ModelRoute))) == 0 {
				return nil
			}
			return []string{o.GetNamespace()}
		}},
	}
}

// SetupIndexes registers Indexes on the cache.
func SetupIndexes(ctx context.Context, idx client.FieldIndexer) error {
	for _, r := range Indexes() {
		if err := idx.IndexField(ctx, r.Object, r.Key, r.Func); err != nil {
			return fmt.Errorf("index %s: %w", r.Key, err)
		}
	}
	return nil
}

// SlicePods are the pods ("ns/name") the endpoints of s point to, not
// terminating, sorted.
func SlicePods(s *discoveryv1.EndpointSlice) []string {
	var out []string
	for _, ep := range s.Endpoints {
		if ep.TargetRef == nil || ep.TargetRef.Kind != "Pod" || ep.TargetRef.Name == "" {
			continue
		}
		if ep.Conditions.Terminating != nil && *ep.Conditions.Terminating {
			continue
		}
		ns := ep.TargetRef.Namespace
		if ns == "" {
			ns = s.Namespace
		}
		out = append(out, ns+"/"+ep.TargetRef.Name)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
