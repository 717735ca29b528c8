package informer

// This file: what the manager's cache holds: only the namespaces watched,
// and of each object only what the controller reads.

import (
	"maps"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/modelsphere/autoconfig/internal/discovery"
)

// ServiceFields are the labels and annotations of a Service the
// controller reads: the others are stripped from the cache.
type ServiceFields struct{ Labels, Annotations []string }

// CacheOptions are the manager cache options the controller needs: managed
// fields and kubectl's last-applied copy stripped from everything and, when
// namespaces is not empty, namespaced objects cached only there (Nodes are
// cluster-scoped and always cached, metadata only; ConfigMaps metadata
// only). Pods are not in the manager's cache: they are cached per
// namespace and label selector, only the pods routes select (PodCaches).
//
// A read of a kind the controller does not watch fails instead of starting
// a cache of it (ErrResourceNotCached): a typed ConfigMap read through the
// cache would otherwise cache every ConfigMap of the cluster in full.
func CacheOptions(namespaces []string, keep ServiceFields) cache.Options {
	o := cache.Options{
		DefaultTransform:            func(o any) (any, error) { return stripUnread(o, keep) },
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
func stripUnread(o any, keep ServiceFields) (any, error) {
	switch o := o.(type) {
	case *discoveryv1.EndpointSlice:
		return discovery.StripEndpointSlice(o)
	case *corev1.Service:
		return stripService(o, keep), nil
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
// the labels and annotations of keep (the managed-by label and the
// fallback-for and allowed-route-namespaces annotations), and of the spec the type, selector, cluster IPs and ports
// (name, protocol, port, target port). Its status, the other labels and
// annotations and the rest of the spec (IP families, traffic policies,
// node ports, load balancer settings) are never read. The result is a new
// object: the transform may run again on a cached one (a resync).
func stripService(s *corev1.Service, keep ServiceFields) *corev1.Service {
	out := &corev1.Service{
		TypeMeta: s.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name, Namespace: s.Namespace, UID: s.UID, ResourceVersion: s.ResourceVersion,
			DeletionTimestamp: s.DeletionTimestamp, OwnerReferences: s.OwnerReferences,
			Labels:      only(s.Labels, keep.Labels),
			Annotations: only(s.Annotations, keep.Annotations),
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

// only is the entries of m with the given keys (nil for none).
func only(m map[string]string, keys []string) map[string]string {
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
