package discovery

import (
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// StripEndpointSlice is a cache transform keeping only what the controller
// reads of an EndpointSlice: identity, the Service-name label, the address
// type, the ports' names and numbers, and per endpoint its addresses,
// Ready and Terminating, node and target pod (kind, namespace, name).
// Annotations, owner references, the other labels, zones, hints,
// hostnames and the target's UID are never read; at 10,000 endpoints they
// were about half of the slices' cache.
//
// The strings and flags most endpoints repeat are shared: node names,
// namespaces and the kind are interned (a cluster has a few of each, and
// every endpoint decoded its own copy), and the conditions point to one
// true and one false. Readers must not modify a cached slice, which
// client.Reader's copies and the UnsafeDisableDeepCopy readers respect.
// The result is a new object, so a transform applied again (a resync)
// yields the same and never changes an object the cache already holds.
func StripEndpointSlice(obj any) (any, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return obj, nil
	}
	out := &discoveryv1.EndpointSlice{
		TypeMeta: s.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name, Namespace: intern(s.Namespace), UID: s.UID, ResourceVersion: s.ResourceVersion,
			DeletionTimestamp: s.DeletionTimestamp,
		},
		AddressType: s.AddressType,
	}
	if svc, ok := s.Labels[discoveryv1.LabelServiceName]; ok {
		out.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
	}
	if len(s.Ports) > 0 {
		out.Ports = make([]discoveryv1.EndpointPort, len(s.Ports))
		for i, p := range s.Ports {
			out.Ports[i] = discoveryv1.EndpointPort{Name: p.Name, Port: p.Port}
		}
	}
	if len(s.Endpoints) > 0 {
		// A slice's endpoints share a few nodes: one *string per node.
		nodes := map[string]*string{}
		out.Endpoints = make([]discoveryv1.Endpoint, len(s.Endpoints))
		for i, ep := range s.Endpoints {
			e := discoveryv1.Endpoint{
				Addresses: ep.Addresses,
				Conditions: discoveryv1.EndpointConditions{
					Ready: sharedBool(ep.Conditions.Ready), Terminating: sharedBool(ep.Conditions.Terminating),
				},
			}
			if ep.NodeName != nil {
				n := nodes[*ep.NodeName]
				if n == nil {
					v := intern(*ep.NodeName)
					n = &v
					nodes[v] = n
				}
				e.NodeName = n
			}
			if t := ep.TargetRef; t != nil {
				e.TargetRef = &corev1.ObjectReference{Kind: intern(t.Kind), Namespace: intern(t.Namespace), Name: t.Name}
			}
			out.Endpoints[i] = e
		}
	}
	return out, nil
}

// intern returns the canonical copy of s: the cache keeps one copy of a
// string its objects repeat.
func intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}

// The targets of the endpoint conditions StripEndpointSlice keeps: never
// written to (cached objects are read-only).
var sharedTrue, sharedFalse = true, false

// sharedBool is b pointing to sharedTrue or sharedFalse (nil stays nil: an
// unset condition has its own meaning).
func sharedBool(b *bool) *bool {
	switch {
	case b == nil:
		return nil
	case *b:
		return &sharedTrue
	default:
		return &sharedFalse
	}
}
