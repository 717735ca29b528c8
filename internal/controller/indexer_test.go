package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/internal/informer"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TestIndexValuesOnce: the cache's field indexes hold each value once,
// in the scope it is read in (the routes' across namespaces, the slices'
// within the slice's namespace; controller-runtime's indexer kept both),
// and the lookups through the cache find the objects, with a cache of
// every namespace and with one scoped to namespaces (--namespace).
func TestIndexValuesOnce(t *testing.T) {
	ns := namespace(t, "index")
	other := namespace(t, "index-other")
	service(t, ns, "svc", 8000)
	endpointSlice(t, ns, "svc-1", "svc", discoveryv1.AddressTypeIPv4, 8000, up("10.2.0.1"))
	createRoute(t, newRoute(ns, "r", "svc"))

	for _, scope := range [][]string{nil, {ns, other}} {
		t.Run(fmt.Sprintf("namespaces=%v", scope), func(t *testing.T) {
			h := newHarness(t, scope...)
			defer h.stop()
			ctx := context.Background()
			eventually(t, "the route found by its Service", func() (bool, string) {
				got := informer.RoutesBy(ctx, h.r.Client, discovery.IndexRouteService, ns+"/svc")
				return len(got) == 1 && got[0].Name == "r", fmt.Sprint(len(got))
			})
			eventually(t, "the slice found by its Service in its namespace", func() (bool, string) {
				var sl discoveryv1.EndpointSliceList
				err := h.r.Client.List(ctx, &sl, client.InNamespace(ns), client.MatchingFields{discovery.IndexSliceService: ns + "/svc"})
				return err == nil && len(sl.Items) == 1, fmt.Sprint(err, len(sl.Items))
			})
			if scope != nil {
				return // a scoped cache's informer spans one informer per namespace
			}
			keys := func(obj client.Object, field string) []string {
				inf, err := h.cache.GetInformer(ctx, obj)
				must(t, err)
				ix, ok := inf.(interface{ GetIndexer() toolscache.Indexer })
				if !ok {
					t.Fatalf("informer %T has no indexer", inf)
				}
				return ix.GetIndexer().ListIndexFuncValues("field:" + field)
			}
			routeKeys := keys(&v1alpha1.ModelRoute{}, discovery.IndexRouteService)
			if !slices.Contains(routeKeys, "__all_namespaces/"+ns+"/svc") {
				t.Fatalf("route index values %v: the value read across namespaces is missing", routeKeys)
			}
			for _, k := range routeKeys {
				if !strings.HasPrefix(k, "__all_namespaces/") {
					t.Errorf("route index value %q: a second, namespaced copy (never read)", k)
				}
			}
			sliceKeys := keys(&discoveryv1.EndpointSlice{}, discovery.IndexSliceService)
			if !slices.Contains(sliceKeys, ns+"/"+ns+"/svc") {
				t.Fatalf("slice index values %v: the value read within the namespace is missing", sliceKeys)
			}
			for _, k := range sliceKeys {
				if strings.HasPrefix(k, "__all_namespaces/") {
					t.Errorf("slice index value %q: a second copy across namespaces (never read)", k)
				}
			}
		})
	}
}
