package controller

// This file: what the controller asks of the pod caches (internal/informer):
// which caches routes read, and how the steps read them.

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/internal/informer"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// podReaderFunc reads the pods of ns that selector matches.
type podReaderFunc func(ctx context.Context, ns, selector string) (client.Reader, error)

// podReader reads the pods of ns matching selector from their pod cache
// (started on first use); from c without pod caches (tests without a
// manager, previews).
func podReader(caches *informer.PodCaches, c client.Reader) podReaderFunc {
	return func(ctx context.Context, ns, selector string) (client.Reader, error) {
		if caches == nil {
			return c, nil
		}
		return caches.Reader(ctx, ns, selector)
	}
}

// watched reports whether the controller caches namespace ns (namespaces:
// --namespace; empty = all).
func watched(namespaces []string, ns string) bool {
	return len(namespaces) == 0 || slices.Contains(namespaces, ns)
}

// podSelectors lists the pod caches routes read: one per distinct selector
// of the routes that select pods (discovery.RouteSelectors, in the route's
// namespace), and one per consumer Service (spec.nginx.service,
// spec.cart.service) whose pods report what they serve: the pods its
// selector matches.
func podSelectors(ctx context.Context, c client.Reader, namespaces []string) ([]informer.PodKey, error) {
	var l v1alpha1.ModelRouteList
	if err := c.List(ctx, &l, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	var out []informer.PodKey
	add := func(k informer.PodKey) {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	for i := range l.Items {
		rt := &l.Items[i]
		for _, s := range discovery.RouteSelectors(rt) {
			if k, _, err := informer.NewPodKey(rt.Namespace, s); err == nil {
				add(k)
			}
		}
		for _, g := range consumerGroups(rt) {
			if g.service == "" {
				continue
			}
			if ns, _, _ := strings.Cut(g.service, "/"); !watched(namespaces, ns) {
				continue
			}
			ns, sel, err := servicePods(ctx, c, g.service)
			if err != nil {
				return nil, err
			}
			if k, _, err := informer.NewPodKey(ns, sel); err == nil {
				add(k)
			}
		}
	}
	return out, nil
}

// servicePods tells which pods are behind the Service ref ("ns/name"):
// those of its namespace that its selector matches; every pod of the
// namespace for a Service without a selector (whose endpoints someone else
// maintains) or not in the cache (yet).
func servicePods(ctx context.Context, c client.Reader, ref string) (ns, selector string, err error) {
	ns, name, _ := strings.Cut(ref, "/")
	var svc corev1.Service
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &svc); err != nil {
		if apierrors.IsNotFound(err) {
			return ns, "", nil
		}
		return ns, "", fmt.Errorf("get service %s: %w", ref, err)
	}
	return ns, labels.SelectorFromSet(svc.Spec.Selector).String(), nil
}
