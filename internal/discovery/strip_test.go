package discovery

import (
	"fmt"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// fullSlice is an EndpointSlice with every field the API server can send
// set, including those the controller never reads.
func fullSlice() *discoveryv1.EndpointSlice {
	now := metav1.Now()
	full := func(addr string, ready, serving, terminating *bool, node, pod string) discoveryv1.Endpoint {
		e := ep(addr, ready, terminating, node)
		e.Conditions.Serving = serving
		e.Hostname = ptr("h-" + pod)
		e.Zone = ptr("zone-a")
		e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}
		e.DeprecatedTopology = map[string]string{"topology.kubernetes.io/zone": "zone-a"}
		if pod != "" {
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "llm", Name: pod, UID: types.UID("uid-" + pod), ResourceVersion: "7", APIVersion: "v1"}
		}
		return e
	}
	return &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "qwen-abc", Namespace: "llm", UID: "uid-slice", ResourceVersion: "42", Generation: 3,
			GenerateName: "qwen-", CreationTimestamp: now,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: "qwen", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io",
				"app": "qwen",
			},
			Annotations:     map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": now.String()},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "qwen", UID: "uid-svc", Controller: ptr(true)}},
			Finalizers:      []string{"example.com/keep"},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager"}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("http"), Port: ptr(int32(8000)), Protocol: ptr(corev1.ProtocolTCP), AppProtocol: ptr("http")},
			{Name: ptr(DispatchPortName), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)},
		},
		Endpoints: []discoveryv1.Endpoint{
			full("10.0.0.1", yes, yes, no, "n1", "qwen-0"),
			full("10.0.0.2", nil, yes, nil, "n1", "qwen-1"), // nil Ready: ready
			full("10.0.0.3", no, no, no, "n2", "qwen-2"),    // not ready
			full("10.0.0.4", yes, yes, yes, "n2", "qwen-3"), // terminating
			full("10.0.0.5", yes, nil, nil, "", ""),         // no node, no target
		},
	}
}

// TestStripEndpointSlice: the cached slice keeps exactly the fields the
// controller reads, and every reader of slices (discovery with each
// option, the consumers' target pods, the ports, the indexes) answers the
// same from it as from the full slice. A field a reader needs and the
// transform dropped fails here.
func TestStripEndpointSlice(t *testing.T) {
	in := fullSlice()
	before := in.DeepCopy()
	o, err := StripEndpointSlice(in)
	if err != nil {
		t.Fatal(err)
	}
	s := o.(*discoveryv1.EndpointSlice)
	if !reflect.DeepEqual(in, before) {
		t.Fatal("the transform modified its input (a cached object on a resync)")
	}

	kept := func(addr string, ready, terminating *bool, node, pod string) discoveryv1.Endpoint {
		e := ep(addr, ready, terminating, node)
		if pod != "" {
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "llm", Name: pod}
		}
		return e
	}
	want := &discoveryv1.EndpointSlice{
		TypeMeta: in.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: "qwen-abc", Namespace: "llm", UID: "uid-slice", ResourceVersion: "42",
			Labels: map[string]string{discoveryv1.LabelServiceName: "qwen"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("http"), Port: ptr(int32(8000))},
			{Name: ptr(DispatchPortName), Port: ptr(int32(8080))},
		},
		Endpoints: []discoveryv1.Endpoint{
			kept("10.0.0.1", yes, no, "n1", "qwen-0"),
			kept("10.0.0.2", nil, nil, "n1", "qwen-1"),
			kept("10.0.0.3", no, no, "n2", "qwen-2"),
			kept("10.0.0.4", yes, yes, "n2", "qwen-3"),
			kept("10.0.0.5", yes, nil, "", ""),
		},
	}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("stripped slice\n got %+v\nwant %+v", s, want)
	}

	full, slim := []discoveryv1.EndpointSlice{*in}, []discoveryv1.EndpointSlice{*s}
	for _, o := range []Options{{}, {IncludeNotReady: true}, {Port: 9000}, {Port: 9000, IncludeNotReady: true}} {
		a, errA := FromEndpointSlices(full, o)
		b, errB := FromEndpointSlices(slim, o)
		if !reflect.DeepEqual(a, b) || fmt.Sprint(errA) != fmt.Sprint(errB) {
			t.Errorf("FromEndpointSlices %+v: full %v (%v), stripped %v (%v)", o, a, errA, b, errB)
		}
	}
	if a, b := SlicePods(in), SlicePods(s); !reflect.DeepEqual(a, b) || len(a) != 3 {
		t.Errorf("SlicePods: full %v, stripped %v", a, b)
	}
	if a, b := DispatchPort(full), DispatchPort(slim); a != b || a != 8080 {
		t.Errorf("DispatchPort: full %d, stripped %d", a, b)
	}
	if a, b := SlicePortName(full, 8000), SlicePortName(slim, 8000); a != b || a != "http" {
		t.Errorf("SlicePortName: full %q, stripped %q", a, b)
	}
	for _, ix := range Indexes() {
		if _, ok := ix.Object.(*discoveryv1.EndpointSlice); !ok {
			continue
		}
		if a, b := ix.Func(in), ix.Func(s); !reflect.DeepEqual(a, b) || len(a) == 0 {
			t.Errorf("index %s: full %v, stripped %v", ix.Key, a, b)
		}
	}

	// Applied again (a resync) it changes nothing.
	again, _ := StripEndpointSlice(s)
	if !reflect.DeepEqual(again, s) {
		t.Fatalf("stripping a stripped slice changed it: %+v", again)
	}
	// The shared condition targets stay true and false.
	if !sharedTrue || sharedFalse {
		t.Fatal("a shared condition value was written through")
	}
}
