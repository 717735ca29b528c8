package informer

// This file: the cache's field indexes, each value kept once.

import (
	"context"
	"fmt"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/discovery"
)

// onceIndexer is the manager's field indexer (client.FieldIndexer) keeping
// each value of a namespaced object once. controller-runtime's keeps it
// twice: under the object's namespace, for a List with InNamespace, and
// under all namespaces, for a List without; and every distinct value of
// an index is a set (a map) of its own. Each index here is read one way
// only: the route indexes across namespaces (Routes.By), the EndpointSlice
// index within the slice's namespace (discovery.Reader). At 1000 routes
// the index maps were 2.9 MB of the live heap, 1.6 MB with each value
// once.
//
// The keys are the ones controller-runtime's cache reader looks up: index
// "field:<field>", value "<namespace>/<value>" or
// "__all_namespaces/<value>" (TestIndexValuesOnce reads them through the
// cache).
type onceIndexer struct {
	informers cache.Informers
	// namespaced are the fields read with InNamespace.
	namespaced map[string]bool
}

// allNamespaces is controller-runtime's namespace of the index values read
// without InNamespace.
const allNamespaces = "__all_namespaces"

// IndexField adds the index to obj's informer (client.FieldIndexer).
func (ix onceIndexer) IndexField(ctx context.Context, obj client.Object, field string, extract client.IndexerFunc) error {
	inf, err := ix.informers.GetInformer(ctx, obj)
	if err != nil {
		return fmt.Errorf("index %s: %w", field, err)
	}
	namespaced := ix.namespaced[field]
	return inf.AddIndexers(toolscache.Indexers{"field:" + field: func(raw any) ([]string, error) {
		o, ok := raw.(client.Object)
		if !ok {
			return nil, fmt.Errorf("index %s: object of type %T is not an Object", field, raw)
		}
		vals := extract(o)
		ns := allNamespaces
		if namespaced && o.GetNamespace() != "" {
			ns = o.GetNamespace()
		}
		out := make([]string, len(vals))
		for i, v := range vals {
			out[i] = ns + "/" + v
		}
		return out, nil
	}})
}

// Indexer is the indexer the controller registers its indexes with, on
// c's informers: the EndpointSlice index is read within a namespace, the
// others across namespaces.
func Indexer(c cache.Informers) client.FieldIndexer {
	return onceIndexer{informers: c, namespaced: map[string]bool{discovery.IndexSliceService: true}}
}
