package controller

import (
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TestCanaryDiscovery: spec.canary's endpoints are discovered like the
// stable ones — through a Service (granted like any other Service of
// another namespace) or a pod selector — follow their EndpointSlices and
// pods, are counted in status.canaryBackends, and a canary without
// endpoints leaves the route Ready and Degraded (CanaryNoBackends) with the
// stable version's output in place.
func TestCanaryDiscovery(t *testing.T) {
	startManager(t)
	ns := namespace(t, "canary")
	models := namespace(t, "canary-models")
	v4 := discoveryv1.AddressTypeIPv4
	configMap(t, ns, "routes", nil, nil)
	service(t, ns, "qwen", 8000)
	endpointSlice(t, ns, "qwen-a", "qwen", v4, 8000, up("10.30.0.1", "10.30.0.2"))
	service(t, models, "qwen-v2", 8000)
	endpointSlice(t, models, "qwen-v2-a", "qwen-v2", v4, 8000, up("10.31.0.1"))

	createRoute(t, newRoute(ns, "qwen", "qwen", func(r *v1alpha1.ModelRoute) {
		r.Spec.Canary = &v1alpha1.Canary{Discovery: v1alpha1.Discovery{Service: models + "/qwen-v2"}, Weight: 10}
	}))
	// A Service of another namespace needs its grant, as spec.discovery's.
	waitCondition(t, ns, "qwen", metav1.ConditionFalse, ReasonNotPermitted)
	if _, ok := cmKey(t, ns, "routes", routeKey("qwen")); ok {
		t.Fatal("the route was written while its canary Service is not granted")
	}
	grantService(t, models, "qwen-v2", ns)
	waitKey(t, ns, "routes", routeKey("qwen"), []string{host("10.30.0.1"), host("10.30.0.2"), host("10.31.0.1")}, nil)
	r := waitCondition(t, ns, "qwen", metav1.ConditionTrue, ReasonReconciled)
	if r.Status.Backends != 2 || r.Status.CanaryBackends != 1 {
		t.Fatalf("status backends %d, canaryBackends %d; want 2 and 1", r.Status.Backends, r.Status.CanaryBackends)
	}
	if d := meta.FindStatusCondition(r.Status.Conditions, TypeDegraded); d != nil {
		t.Fatalf("Degraded with a canary that has endpoints: %+v", d)
	}

	// The canary's EndpointSlice changes: the output follows.
	endpointSlice(t, models, "qwen-v2-a", "qwen-v2", v4, 8000, up("10.31.0.2"))
	waitKey(t, ns, "routes", routeKey("qwen"), []string{host("10.31.0.2"), host("10.30.0.1")}, []string{host("10.31.0.1")})

	// The canary scaled to 0: Ready stays, Degraded says why, the stable
	// version's endpoints stay written.
	endpointSlice(t, models, "qwen-v2-a", "qwen-v2", v4, 8000, nil)
	eventually(t, "Degraded CanaryNoBackends", func() (bool, string) {
		r = getRoute(t, ns, "qwen")
		d := meta.FindStatusCondition(r.Status.Conditions, TypeDegraded)
		return d != nil && d.Status == metav1.ConditionTrue && d.Reason == ReasonCanaryNoBackends && r.Status.CanaryBackends == 0, ""
	})
	waitKey(t, ns, "routes", routeKey("qwen"), []string{host("10.30.0.1"), host("10.30.0.2")}, []string{host("10.31.0.2")})
	waitCondition(t, ns, "qwen", metav1.ConditionTrue, ReasonReconciled)

	// A canary found by pod selector.
	pod(t, ns, "qwen-v3-0", map[string]string{"app": "qwen-v3"}, "10.32.0.1", true, 8000)
	updateRoute(t, ns, "qwen", func(r *v1alpha1.ModelRoute) {
		r.Spec.Canary = &v1alpha1.Canary{Discovery: v1alpha1.Discovery{Selector: "app=qwen-v3"}, Weight: 10}
	})
	waitKey(t, ns, "routes", routeKey("qwen"), []string{host("10.32.0.1"), host("10.30.0.1")}, nil)
	pod(t, ns, "qwen-v3-1", map[string]string{"app": "qwen-v3"}, "10.32.0.2", true, 8000)
	waitKey(t, ns, "routes", routeKey("qwen"), []string{host("10.32.0.1"), host("10.32.0.2")}, nil)
	eventually(t, "canaryBackends 2, not Degraded", func() (bool, string) {
		r = getRoute(t, ns, "qwen")
		return r.Status.CanaryBackends == 2 && meta.FindStatusCondition(r.Status.Conditions, TypeDegraded) == nil, ""
	})
}
