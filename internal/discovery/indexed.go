package discovery

import (
	"context"
	"fmt"
	"slices"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// IndexedReader reads through c (normally a live client of the API server,
// not a cache) and answers List calls with MatchingFields on one of the
// keys of Indexes the way the controller's cache does: it lists without
// the field and keeps the objects the same index function maps to the
// value. IndexSliceService is narrowed on the server by the Service-name
// label first. This lets `autoconfig diff` run the controller's own
// discovery and ownership code against the live cluster, read-only.
func IndexedReader(c client.Reader, scheme *runtime.Scheme) client.Reader {
	idx := map[string]Index{}
	for _, i := range Indexes() {
		idx[i.Key] = i
	}
	return &indexedReader{Reader: c, scheme: scheme, idx: idx}
}

type indexedReader struct {
	client.Reader
	scheme *runtime.Scheme
	idx    map[string]Index
}

func (r *indexedReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	lo := &client.ListOptions{}
	lo.ApplyOptions(opts)
	if lo.FieldSelector == nil || lo.FieldSelector.Empty() {
		return r.Reader.List(ctx, list, opts...)
	}
	reqs := lo.FieldSelector.Requirements()
	if len(reqs) != 1 {
		return fmt.Errorf("indexed reader: one field requirement expected, got %q", lo.FieldSelector.String())
	}
	key, value := reqs[0].Field, reqs[0].Value
	ix, ok := r.idx[key]
	if !ok {
		// A real field selector (e.g. metadata.name): the server knows it.
		return r.Reader.List(ctx, list, opts...)
	}
	gvk, err := apiutil.GVKForObject(list, r.scheme)
	if err != nil {
		return err
	}
	want, err := apiutil.GVKForObject(ix.Object, r.scheme)
	if err != nil {
		return err
	}
	if gvk.Kind != want.Kind+"List" || gvk.Group != want.Group {
		return fmt.Errorf("indexed reader: index %s is on %s, not %s", key, want.Kind, gvk.Kind)
	}
	live := &client.ListOptions{Namespace: lo.Namespace, LabelSelector: lo.LabelSelector, Limit: lo.Limit, Continue: lo.Continue}
	if key == IndexSliceService {
		if ns, svc, ok := strings.Cut(value, "/"); ok && live.LabelSelector == nil {
			live.Namespace = ns
			opts := client.MatchingLabels{discoveryv1.LabelServiceName: svc}
			opts.ApplyToList(live)
		}
	}
	if err := r.Reader.List(ctx, list, live); err != nil {
		return err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return err
	}
	kept := items[:0]
	for _, it := range items {
		if o, ok := it.(client.Object); ok && slices.Contains(ix.Func(o), value) {
			kept = append(kept, it)
		}
	}
	return meta.SetList(list, kept)
}
