package discovery

import (
	"context"
	"fmt"

	"github.com/modelsphere/autoconfig/schema/routespec"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// Reader builds a route's Snapshot from a client.Reader, normally the
// manager's cache with the indexes of SetupIndexes registered.
type Reader struct {
	Client client.Reader
	// Pods, if set, gives the reader of the pods of namespace ns that
	// selector matches (the controller caches pods per namespace and
	// selector, only those routes select); nil reads pods through Client.
	Pods func(ctx context.Context, ns, selector string) (client.Reader, error)
}

// Snapshot discovers everything the compiler needs for route (validated and
// defaulted). An empty backend list is not an error: the caller decides
// (NoBackends). A PortError means the spec must name a port.
func (r *Reader) Snapshot(ctx context.Context, route *v1alpha1.ModelRoute) (compiler.Snapshot, error) {
	var snap compiler.Snapshot
	d := route.Spec.Discovery
	eps, vip, err := r.endpoints(ctx, route.Namespace, d, "spec.discovery.port")
	if err != nil {
		return snap, err
	}
	snap.Backends, snap.BackendService = eps, vip
	if err := r.fillGPU(ctx, snap.Backends); err != nil {
		return snap, err
	}
	if c := route.Spec.Canary; c != nil {
		if snap.CanaryBackends, _, err = r.endpoints(ctx, route.Namespace, c.Discovery, "spec.canary.discovery.port"); err != nil {
			return snap, err
		}
		if err := r.fillGPU(ctx, snap.CanaryBackends); err != nil {
			return snap, err
		}
	}
	if c := route.Spec.Cart; c != nil {
		snap.CartPods, snap.CartService, err = r.endpoints(ctx, route.Namespace, c.Discovery, "spec.cart.port")
		if err != nil {
			return snap, err
		}
	}
	snap.NginxPods, err = r.entry(ctx, route)
	return snap, err
}

// endpoints runs one discovery block: EndpointSlices of a Service (plus its
// VIP) or pods by selector (no VIP).
func (r *Reader) endpoints(ctx context.Context, ns string, d v1alpha1.Discovery, portField string) ([]compiler.Endpoint, *compiler.ServiceVIP, error) {
	o := Options{Port: d.Port, IncludeNotReady: d.IncludeNotReady, PortField: portField}
	if d.Service == "" {
		pods, err := r.pods(ctx, ns, d.Selector)
		if err != nil {
			return nil, nil, err
		}
		eps, err := FromPods(pods, o)
		return eps, nil, err
	}
	sns, name := routespec.SplitRef(d.Service, ns)
	items, err := r.slices(ctx, sns, name)
	if err != nil {
		return nil, nil, err
	}
	eps, err := FromEndpointSlices(items, o)
	if err != nil {
		return nil, nil, err
	}
	var svc corev1.Service
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: sns, Name: name}, &svc); err != nil {
		if apierrors.IsNotFound(err) {
			return eps, nil, nil
		}
		return nil, nil, fmt.Errorf("get service %s/%s: %w", sns, name, err)
	}
	target := d.Port
	if target == 0 && len(eps) > 0 {
		target = eps[0].Port
	}
	return eps, ServiceVIP(&svc, target, SlicePortName(items, target)), nil
}

// entry discovers the nginx entry pods (monitor nginx: lines) on their
// dispatch port; it never fails on ports.
func (r *Reader) entry(ctx context.Context, route *v1alpha1.ModelRoute) ([]compiler.Endpoint, error) {
	n := route.Spec.Nginx
	switch {
	case n.Service != "":
		sns, name := routespec.SplitRef(n.Service, route.Namespace)
		items, err := r.slices(ctx, sns, name)
		if err != nil {
			return nil, err
		}
		return FromEndpointSlices(items, Options{Port: DispatchPort(items)})
	case n.Selector != "":
		pods, err := r.pods(ctx, route.Namespace, n.Selector)
		if err != nil {
			return nil, err
		}
		return FromPods(pods, Options{Port: PodDispatchPort(pods)})
	}
	return nil, nil
}

func (r *Reader) slices(ctx context.Context, ns, svc string) ([]discoveryv1.EndpointSlice, error) {
	var l discoveryv1.EndpointSliceList
	if err := r.Client.List(ctx, &l, client.InNamespace(ns), client.MatchingFields{IndexSliceService: ns + "/" + svc}); err != nil {
		return nil, fmt.Errorf("list endpointslices of %s/%s: %w", ns, svc, err)
	}
	return l.Items, nil
}

func (r *Reader) pods(ctx context.Context, ns, selector string) ([]corev1.Pod, error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, fmt.Errorf("selector %q: %w", selector, err)
	}
	reader := r.Client
	if r.Pods != nil {
		if reader, err = r.Pods(ctx, ns, selector); err != nil {
			return nil, err
		}
	}
	var l corev1.PodList
	if err := reader.List(ctx, &l, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("list pods %q in %s: %w", selector, ns, err)
	}
	return l.Items, nil
}

// fillGPU reads the GPU label of the backends' nodes (metadata only).
func (r *Reader) fillGPU(ctx context.Context, eps []compiler.Endpoint) error {
	nodes := map[string]map[string]string{}
	for _, e := range eps {
		if e.Node == "" {
			continue
		}
		if _, done := nodes[e.Node]; done {
			continue
		}
		m := NodeMeta()
		if err := r.Client.Get(ctx, client.ObjectKey{Name: e.Node}, m); err != nil {
			if apierrors.IsNotFound(err) {
				nodes[e.Node] = nil
				continue
			}
			return fmt.Errorf("get node %s: %w", e.Node, err)
		}
		nodes[e.Node] = m.Labels
	}
	FillGPU(eps, nodes)
	return nil
}

// NodeMeta returns an empty metadata-only Node: the controller caches node
// metadata only (it reads nothing but the GPU label).
func NodeMeta() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	return m
}

// StripPod is a cache transform keeping only what discovery reads of a Pod:
// identity, labels, deletion, node, container ports, phase, IPs and the
// Ready condition (and a consumer pod's served report). On a cluster with
// thousands of pods this is most of the controller's memory. It is
// CompactPod(pod).Pod(): what a pod cache keeps is exactly this.
func StripPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return CompactPod(p).Pod(), nil
}
