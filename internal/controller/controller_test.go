package controller

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/modelsphere/autoconfig/internal/informer"
	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/internal/testenv"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

const v4, v6 = discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6

func TestScaleUpAndDownFollowed(t *testing.T) {
	ns := namespace(t, "scale")
	h := startManager(t, ns)
	service(t, ns, "qwen", 8000)
	endpointSlice(t, ns, "qwen-a", "qwen", v4, 8000, up("10.1.0.1", "10.1.0.2"))
	configMap(t, ns, "routes", map[string]string{"other.conf": "# not ours"}, nil)
	createRoute(t, newRoute(ns, "qwen", "qwen"))

	waitKey(t, ns, "routes", routeKey("qwen"), []string{host("10.1.0.1"), host("10.1.0.2")}, nil)
	r := waitCondition(t, ns, "qwen", metav1.ConditionTrue, ReasonReconciled)
	if r.Status.Backends != 2 || r.Status.ObservedGeneration != r.Generation {
		t.Fatalf("status: %+v", r.Status)
	}
	if !controllerutil.ContainsFinalizer(r, Finalizer) {
		t.Fatalf("finalizer missing: %v", r.Finalizers)
	}

	// Scale up: a second slice (slices split at 100 endpoints) plus one more.
	endpointSlice(t, ns, "qwen-b", "qwen", v4, 8000, up("10.1.0.3"))
	endpointSlice(t, ns, "qwen-a", "qwen", v4, 8000, up("10.1.0.1", "10.1.0.2", "10.1.0.4"))
	waitKey(t, ns, "routes", routeKey("qwen"), []string{host("10.1.0.1"), host("10.1.0.2"), host("10.1.0.3"), host("10.1.0.4")}, nil)

	// Scale down: a terminating endpoint drops out at once.
	endpointSlice(t, ns, "qwen-a", "qwen", v4, 8000, []backend{{ip: "10.1.0.1", ready: true}, {ip: "10.1.0.2", terminating: true}})
	must(t, k8s.Delete(context.Background(), &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen-b"}}))
	waitKey(t, ns, "routes", routeKey("qwen"), []string{host("10.1.0.1")}, []string{host("10.1.0.2"), host("10.1.0.3"), host("10.1.0.4")})
	eventually(t, "status.backends=1", func() (bool, string) {
		r := getRoute(t, ns, "qwen")
		return r.Status.Backends == 1, fmt.Sprint(r.Status.Backends)
	})
	if v, _ := cmKey(t, ns, "routes", "other.conf"); v != "# not ours" {
		t.Fatalf("another key was touched: %q", v)
	}
	if h.c.cmCreates.Load() != 0 {
		t.Fatal("a ConfigMap was created")
	}
}

func TestReadyFlip(t *testing.T) {
	ns := namespace(t, "flip")
	startManager(t, ns)
	service(t, ns, "m", 8000)
	endpointSlice(t, ns, "m-a", "m", v4, 8000, up("10.2.0.1", "10.2.0.2"))
	configMap(t, ns, "routes", nil, nil)
	createRoute(t, newRoute(ns, "m", "m"))
	waitKey(t, ns, "routes", routeKey("m"), []string{host("10.2.0.1"), host("10.2.0.2")}, nil)

	endpointSlice(t, ns, "m-a", "m", v4, 8000, []backend{{ip: "10.2.0.1", ready: true}, {ip: "10.2.0.2", ready: false}})
	waitKey(t, ns, "routes", routeKey("m"), []string{host("10.2.0.1")}, []string{host("10.2.0.2")})
	endpointSlice(t, ns, "m-a", "m", v4, 8000, up("10.2.0.1", "10.2.0.2"))
	waitKey(t, ns, "routes", routeKey("m"), []string{host("10.2.0.1"), host("10.2.0.2")}, nil)

	// includeNotReady takes the not-ready one too.
	endpointSlice(t, ns, "m-a", "m", v4, 8000, []backend{{ip: "10.2.0.1", ready: true}, {ip: "10.2.0.2", ready: false}})
	updateRoute(t, ns, "m", func(r *v1alpha1.ModelRoute) { r.Spec.Discovery.IncludeNotReady = true })
	waitCondition(t, ns, "m", metav1.ConditionTrue, ReasonReconciled)
	waitKey(t, ns, "routes", routeKey("m"), []string{host("10.2.0.1"), host("10.2.0.2")}, nil)
}

func TestCrossNamespaceServiceAndDualStack(t *testing.T) {
	routes, models := namespace(t, "central"), namespace(t, "models")
	startManager(t, routes, models)
	service(t, models, "llama", 8000)
	endpointSlice(t, models, "llama-v4", "llama", v4, 8000, up("10.3.0.1"))
	endpointSlice(t, models, "llama-v6", "llama", v6, 8000, up("fd00::3:1"))
	configMap(t, routes, "routes", nil, nil)
	createRoute(t, newRoute(routes, "llama", models+"/llama"))
	// The models namespace has not granted the routes namespace yet:
	// nothing of it is read.
	r := waitCondition(t, routes, "llama", metav1.ConditionFalse, ReasonNotPermitted)
	if r.Status.Backends != 0 {
		t.Fatalf("endpoints of an ungranted namespace counted in status: %+v", r.Status)
	}
	grantService(t, models, "llama", routes)
	waitKey(t, routes, "routes", routeKey("llama"), []string{host("10.3.0.1"), host("fd00::3:1")}, nil)
	r = waitCondition(t, routes, "llama", metav1.ConditionTrue, ReasonReconciled)
	if r.Status.Backends != 2 {
		t.Fatalf("backends: %+v", r.Status)
	}
	endpointSlice(t, models, "llama-v6", "llama", v6, 8000, up("fd00::3:1", "fd00::3:2"))
	waitKey(t, routes, "routes", routeKey("llama"), []string{host("fd00::3:2")}, nil)
}

// pod creates a pod and then sets its status as a kubelet would: IP and
// Ready condition (there is no kubelet in envtest).
func pod(t testing.TB, ns, name string, labels map[string]string, ip string, ready bool, ports ...int32) {
	t.Helper()
	testenv.Pod(t, k8s, ns, name, labels, ip, ready, ports...)
}

func setPodStatus(t testing.TB, p *corev1.Pod, ip string, ready bool) {
	t.Helper()
	testenv.SetPodStatus(t, k8s, p, ip, ready)
}

func TestSelectorMode(t *testing.T) {
	ns := namespace(t, "sel")
	startManager(t, ns)
	must(t, k8s.Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Labels: map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}))
	t.Cleanup(func() {
		_ = k8s.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	})
	configMap(t, ns, "routes", nil, nil)
	configMap(t, ns, "monitor", nil, nil)
	app := map[string]string{"app": "ds"}
	pod(t, ns, "ds-0", app, "10.4.0.1", true, 8000)
	pod(t, ns, "ds-1", app, "10.4.0.2", false, 8000)
	pod(t, ns, "other", map[string]string{"app": "x"}, "10.4.0.9", true, 8000)
	createRoute(t, newRoute(ns, "ds", "", func(r *v1alpha1.ModelRoute) {
		r.Spec.Discovery = v1alpha1.Discovery{Selector: "app=ds"}
		r.Spec.Monitor = &v1alpha1.Monitor{OutputConfigMap: "monitor"}
	}))
	waitKey(t, ns, "routes", routeKey("ds"), []string{host("10.4.0.1"), "8000"}, []string{host("10.4.0.2"), host("10.4.0.9")})
	waitKey(t, ns, "monitor", "ds.monitor.conf", []string{"10.4.0.1:8000", "H100"}, nil)

	// The second pod becomes ready.
	var p corev1.Pod
	must(t, k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "ds-1"}, &p))
	setPodStatus(t, &p, "10.4.0.2", true)
	waitKey(t, ns, "routes", routeKey("ds"), []string{host("10.4.0.1"), host("10.4.0.2")}, nil)

	// A matching pod with two ports: the port cannot be derived; the last
	// good output stays.
	pod(t, ns, "ds-2", app, "10.4.0.3", true, 8000, 9000)
	r := waitCondition(t, ns, "ds", metav1.ConditionFalse, ReasonPortNotDerivable)
	if c := findCond(r, TypeStalled); c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "spec.discovery.port") {
		t.Fatalf("Stalled: %+v", c)
	}
	waitKey(t, ns, "routes", routeKey("ds"), []string{host("10.4.0.1"), host("10.4.0.2")}, []string{host("10.4.0.3")})
	updateRoute(t, ns, "ds", func(r *v1alpha1.ModelRoute) { r.Spec.Discovery.Port = 8000 })
	waitKey(t, ns, "routes", routeKey("ds"), []string{host("10.4.0.1"), host("10.4.0.2"), host("10.4.0.3")}, nil)

	// The node's GPU label changes: the node's selected pods lead to the
	// route (informer.Routes.MapNode), which renders the new GPU type.
	var n corev1.Node
	must(t, k8s.Get(context.Background(), client.ObjectKey{Name: "gpu-1"}, &n))
	n.Labels["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-80GB"
	must(t, k8s.Update(context.Background(), &n))
	waitKey(t, ns, "monitor", "ds.monitor.conf", []string{"A100"}, []string{"H100"})
}

func findCond(r *v1alpha1.ModelRoute, typ string) *metav1.Condition {
	for i := range r.Status.Conditions {
		if r.Status.Conditions[i].Type == typ {
			return &r.Status.Conditions[i]
		}
	}
	return nil
}

func TestTwentyRoutesShareOneConfigMap(t *testing.T) {
	ns := namespace(t, "shared")
	base := reconciles(t)
	h := startManager(t, ns)
	configMap(t, ns, "routes", map[string]string{"keep.conf": "x"}, nil)
	const n = 20
	for i := range n {
		name := fmt.Sprintf("m%02d", i)
		service(t, ns, name, 8000)
		endpointSlice(t, ns, name+"-a", name, v4, 8000, up(fmt.Sprintf("10.5.%d.1", i)))
	}
	// Create the routes concurrently: up to 4 reconciles write the same
	// ConfigMap at once.
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { createRoute(t, newRoute(ns, fmt.Sprintf("m%02d", i), fmt.Sprintf("m%02d", i))) })
	}
	wg.Wait()
	eventually(t, "20 keys", func() (bool, string) {
		cm, err := getCM(t, ns, "routes")
		if err != nil {
			return false, err.Error()
		}
		for i := range n {
			v := cm.Data[routeKey(fmt.Sprintf("m%02d", i))]
			if !strings.Contains(v, host(fmt.Sprintf("10.5.%d.1", i))) {
				return false, fmt.Sprintf("m%02d missing; %d keys", i, len(cm.Data))
			}
		}
		return cm.Data["keep.conf"] == "x", "keep.conf changed"
	})
	// Now change every route's backends at once: each key follows.
	for i := range n {
		wg.Go(func() {
			name := fmt.Sprintf("m%02d", i)
			endpointSlice(t, ns, name+"-a", name, v4, 8000, up(fmt.Sprintf("10.5.%d.2", i)))
		})
	}
	wg.Wait()
	eventually(t, "20 keys updated", func() (bool, string) {
		cm, _ := getCM(t, ns, "routes")
		for i := range n {
			v := cm.Data[routeKey(fmt.Sprintf("m%02d", i))]
			if !hasAll(v, []string{host(fmt.Sprintf("10.5.%d.2", i))}, []string{host(fmt.Sprintf("10.5.%d.1", i))}) {
				return false, fmt.Sprintf("m%02d not updated", i)
			}
		}
		return true, ""
	})
	// At most one write per key change (no lost update, no redundant
	// rewrite); the batched writer folds concurrent ones together.
	var names []types.NamespacedName
	for i := range n {
		names = append(names, types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("m%02d", i)})
	}
	waitQuiet(t, h, base, nil, names...)
	t.Logf("ConfigMap writes for 40 key changes: %d (conflicts retried: %d)", h.c.cmWrites.Load(), h.c.cmConflicts.Load())
	if w := h.c.cmWrites.Load(); w < 2 || w > 40 {
		t.Fatalf("%d ConfigMap writes for 40 key changes, want 2 to 40", w)
	}
}

func TestDeleteRouteRemovesOnlyItsKeys(t *testing.T) {
	ns := namespace(t, "del")
	startManager(t, ns)
	for _, m := range []string{"a", "b"} {
		service(t, ns, m, 8000)
		endpointSlice(t, ns, m+"-1", m, v4, 8000, up("10.6.0.1"))
	}
	configMap(t, ns, "routes", map[string]string{"hand.conf": "x"}, nil)
	configMap(t, ns, "monitor", nil, nil)
	configMap(t, ns, "cart", map[string]string{"config.yaml": "server:\n  port: 9000 # kept\nworkers: []\n"}, nil)
	withMon := func(r *v1alpha1.ModelRoute) {
		r.Spec.Monitor = &v1alpha1.Monitor{OutputConfigMap: "monitor"}
	}
	createRoute(t, newRoute(ns, "a", "a", withMon, func(r *v1alpha1.ModelRoute) {
		r.Spec.Cart = &v1alpha1.Cart{Discovery: v1alpha1.Discovery{Service: "a"}, OutputConfigMap: "cart"}
	}))
	createRoute(t, newRoute(ns, "b", "b", withMon))
	waitKey(t, ns, "routes", routeKey("a"), []string{host("10.6.0.1")}, nil)
	waitKey(t, ns, "routes", routeKey("b"), []string{host("10.6.0.1")}, nil)
	waitKey(t, ns, "monitor", "a.monitor.conf", []string{"10.6.0.1"}, nil)
	waitKey(t, ns, "monitor", "b.monitor.conf", []string{"10.6.0.1"}, nil)
	cart := waitKey(t, ns, "cart", "config.yaml", []string{"http://10.6.0.1:8000", "port: 9000 # kept"}, nil)

	must(t, k8s.Delete(context.Background(), getRoute(t, ns, "a")))
	eventually(t, "route a gone", func() (bool, string) {
		err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "a"}, &v1alpha1.ModelRoute{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	cm, _ := getCM(t, ns, "routes")
	if _, ok := cm.Data[routeKey("a")]; ok || cm.Data["hand.conf"] != "x" || cm.Data[routeKey("b")] == "" {
		t.Fatalf("routes after delete: %v", keys(cm.Data))
	}
	mon, _ := getCM(t, ns, "monitor")
	if _, ok := mon.Data["a.monitor.conf"]; ok || mon.Data["b.monitor.conf"] == "" {
		t.Fatalf("monitor after delete: %v", keys(mon.Data))
	}
	// The CART config is per model and CART refuses empty workers: left.
	if v, _ := cmKey(t, ns, "cart", "config.yaml"); v != cart {
		t.Fatalf("cart config changed on delete:\n%s", v)
	}

	// A missing ConfigMap does not block deletion.
	must(t, k8s.Delete(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "monitor"}}))
	waitCondition(t, ns, "b", metav1.ConditionFalse, ReasonOutputConfigMapMissing)
	must(t, k8s.Delete(context.Background(), getRoute(t, ns, "b")))
	eventually(t, "route b gone", func() (bool, string) {
		err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "b"}, &v1alpha1.ModelRoute{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if _, err := getCM(t, ns, "monitor"); !apierrors.IsNotFound(err) {
		t.Fatalf("monitor ConfigMap recreated: %v", err)
	}
	cm, _ = getCM(t, ns, "routes")
	if len(cm.Data) != 1 || cm.Data["hand.conf"] != "x" {
		t.Fatalf("routes after both deletes: %v", keys(cm.Data))
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestMissingConfigMapNeverCreated(t *testing.T) {
	ns := namespace(t, "missing")
	h := startManager(t, ns)
	service(t, ns, "m", 8000)
	endpointSlice(t, ns, "m-a", "m", v4, 8000, up("10.7.0.1"))
	createRoute(t, newRoute(ns, "m", "m"))
	r := waitCondition(t, ns, "m", metav1.ConditionFalse, ReasonOutputConfigMapMissing)
	if c := findCond(r, TypeStalled); c == nil || c.Reason != ReasonOutputConfigMapMissing {
		t.Fatalf("Stalled: %+v", c)
	}
	waitEvent(t, ns, "m", ReasonOutputConfigMapMissing)
	if _, err := getCM(t, ns, "routes"); !apierrors.IsNotFound(err) {
		t.Fatalf("ConfigMap exists: %v", err)
	}
	if h.c.cmCreates.Load() != 0 {
		t.Fatal("create called")
	}
	// The consumer's chart creates it: written without any route change.
	configMap(t, ns, "routes", nil, nil)
	waitKey(t, ns, "routes", routeKey("m"), []string{host("10.7.0.1")}, nil)
	r = waitCondition(t, ns, "m", metav1.ConditionTrue, ReasonReconciled)
	if findCond(r, TypeStalled) != nil {
		t.Fatalf("Stalled left behind: %+v", r.Status.Conditions)
	}
	waitEvent(t, ns, "m", ReasonReconciled)
}

func waitEvent(t testing.TB, ns, route, reason string) {
	t.Helper()
	eventually(t, "event "+reason, func() (bool, string) {
		var l eventsv1.EventList
		if err := k8s.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range l.Items {
			if e.Regarding.Name == route && e.Reason == reason {
				return true, ""
			}
			seen = append(seen, e.Reason)
		}
		return false, fmt.Sprint(seen)
	})
}

func TestEmptyDiscoveryKeepsLastGood(t *testing.T) {
	ns := namespace(t, "empty")
	h := startManager(t, ns)
	service(t, ns, "m", 8000)
	endpointSlice(t, ns, "m-a", "m", v4, 8000, up("10.8.0.1", "10.8.0.2"))
	configMap(t, ns, "routes", nil, nil)
	createRoute(t, newRoute(ns, "m", "m"))
	good := waitKey(t, ns, "routes", routeKey("m"), []string{host("10.8.0.1"), host("10.8.0.2")}, nil)
	waitCondition(t, ns, "m", metav1.ConditionTrue, ReasonReconciled)
	writes := h.c.cmWrites.Load()

	endpointSlice(t, ns, "m-a", "m", v4, 8000, []backend{{ip: "10.8.0.1"}, {ip: "10.8.0.2", terminating: true}})
	r := waitCondition(t, ns, "m", metav1.ConditionFalse, ReasonNoBackends)
	if c := findCond(r, TypeReconciling); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("Reconciling: %+v", r.Status.Conditions)
	}
	if v, _ := cmKey(t, ns, "routes", routeKey("m")); v != good {
		t.Fatalf("last good output replaced:\n%s", v)
	}
	if w := h.c.cmWrites.Load(); w != writes {
		t.Fatalf("ConfigMap written %d times with no backends", w-writes)
	}
	endpointSlice(t, ns, "m-a", "m", v4, 8000, up("10.8.0.3"))
	waitKey(t, ns, "routes", routeKey("m"), []string{host("10.8.0.3")}, []string{host("10.8.0.1")})
	waitCondition(t, ns, "m", metav1.ConditionTrue, ReasonReconciled)
}

func TestCrossNamespaceWriteNeedsOptIn(t *testing.T) {
	routes, shared := namespace(t, "team"), namespace(t, "gateway")
	startManager(t, routes, shared)
	service(t, routes, "m", 8000)
	endpointSlice(t, routes, "m-a", "m", v4, 8000, up("10.9.0.1"))
	configMap(t, shared, "routes", map[string]string{"x.conf": "x"}, map[string]string{sink.AllowedNamespacesAnnotation: "someone-else"})
	createRoute(t, newRoute(routes, "m", "m", func(r *v1alpha1.ModelRoute) {
		r.Spec.Nginx.OutputConfigMap = shared + "/routes"
	}))
	r := waitCondition(t, routes, "m", metav1.ConditionFalse, ReasonNotPermitted)
	if c := findCond(r, TypeReady); !strings.Contains(c.Message, sink.AllowedNamespacesAnnotation) {
		t.Fatalf("message does not say what to do: %s", c.Message)
	}
	if cm, _ := getCM(t, shared, "routes"); len(cm.Data) != 1 {
		t.Fatalf("written without permission: %v", keys(cm.Data))
	}
	// The gateway's chart opts in: written without touching the route.
	cm, _ := getCM(t, shared, "routes")
	cm.Annotations[sink.AllowedNamespacesAnnotation] = "someone-else, " + routes
	must(t, k8s.Update(context.Background(), cm))
	waitKey(t, shared, "routes", routeKey("m"), []string{host("10.9.0.1")}, nil)
	waitCondition(t, routes, "m", metav1.ConditionTrue, ReasonReconciled)
}

func TestRestartWritesNothing(t *testing.T) {
	ns := namespace(t, "restart")
	h := startManager(t, ns)
	configMap(t, ns, "routes", nil, nil)
	configMap(t, ns, "monitor", nil, nil)
	configMap(t, ns, "cart", map[string]string{"config.yaml": "server:\n  port: 9000\nworkers: []\n"}, nil)
	const n = 5
	for i := range n {
		name := fmt.Sprintf("r%d", i)
		service(t, ns, name, 8000)
		endpointSlice(t, ns, name+"-a", name, v4, 8000, up(fmt.Sprintf("10.10.%d.1", i), fmt.Sprintf("10.10.%d.2", i)))
		createRoute(t, newRoute(ns, name, name, func(r *v1alpha1.ModelRoute) {
			r.Spec.Monitor = &v1alpha1.Monitor{OutputConfigMap: "monitor"}
			if i == 0 {
				r.Spec.Cart = &v1alpha1.Cart{Discovery: v1alpha1.Discovery{Service: name}, OutputConfigMap: "cart"}
			}
		}))
	}
	for i := range n {
		waitCondition(t, ns, fmt.Sprintf("r%d", i), metav1.ConditionTrue, ReasonReconciled)
	}
	h.stop()

	base := reconciles(t)
	h2 := startManager(t, ns)
	var names []types.NamespacedName
	for i := range n {
		names = append(names, types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("r%d", i)})
	}
	// Every route is reconciled by the new manager (initial list)...
	waitQuiet(t, h2, base, nil, names...)
	// ...then an event on each route's input is processed (a no-op resync).
	since, _ := h2.c.started()
	for i := range n {
		var s discoveryv1.EndpointSlice
		must(t, k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("r%d-a", i)}, &s))
		s.Annotations = map[string]string{"touched": "yes"}
		must(t, k8s.Update(context.Background(), &s))
	}
	waitQuiet(t, h2, base, since, names...)
	if w, s := h2.c.cmWrites.Load()+h2.c.cmConflicts.Load(), h2.c.statusWrites.Load(); w != 0 || s != 0 {
		t.Fatalf("restart wrote %d ConfigMaps and %d statuses; want 0 and 0", w, s)
	}
}

// Keys a route stops rendering are removed: while the controller runs, and
// when the change (or the deletion) happened while no controller ran, from
// what status.outputs says was written. Nobody else's keys are touched.
func TestStaleKeysRemovedAcrossRestarts(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "stale")
	h := startManager(t, ns)
	for _, m := range []string{"a", "b"} {
		service(t, ns, m, 8000)
		endpointSlice(t, ns, m+"-1", m, v4, 8000, up("10.7.0.1"))
	}
	configMap(t, ns, "routes", map[string]string{"hand.conf": "x"}, nil)
	configMap(t, ns, "monitor", nil, nil)
	createRoute(t, newRoute(ns, "a", "a", func(r *v1alpha1.ModelRoute) {
		r.Spec.Monitor = &v1alpha1.Monitor{OutputConfigMap: "monitor"}
	}))
	createRoute(t, newRoute(ns, "b", "b"))
	waitKey(t, ns, "routes", routeKey("a"), []string{host("10.7.0.1")}, nil)
	waitKey(t, ns, "routes", routeKey("b"), []string{host("10.7.0.1")}, nil)
	waitKey(t, ns, "monitor", "a.monitor.conf", []string{"10.7.0.1"}, nil)
	wantOutputs := func(want ...v1alpha1.OutputKeys) {
		t.Helper()
		eventually(t, fmt.Sprintf("status.outputs %v", want), func() (bool, string) {
			got := getRoute(t, ns, "a").Status.Outputs
			return reflect.DeepEqual(got, want), fmt.Sprint(got)
		})
	}
	wantOutputs(v1alpha1.OutputKeys{ConfigMap: ns + "/monitor", Keys: []string{"a.monitor.conf"}},
		v1alpha1.OutputKeys{ConfigMap: ns + "/routes", Keys: []string{routeKey("a")}})
	others := func() {
		t.Helper()
		cm, _ := getCM(t, ns, "routes")
		if cm.Data["hand.conf"] != "x" || !strings.Contains(cm.Data[routeKey("b")], host("10.7.0.1")) {
			t.Fatalf("another owner's key was touched: %v", keys(cm.Data))
		}
	}
	gone := func(cm, key string) {
		t.Helper()
		eventually(t, fmt.Sprintf("%s[%s] removed", cm, key), func() (bool, string) {
			v, ok := cmKey(t, ns, cm, key)
			return !ok, v
		})
	}

	// 1. Renamed while the controller runs.
	updateRoute(t, ns, "a", func(r *v1alpha1.ModelRoute) { r.Spec.Nginx.Route = "a2" })
	waitKey(t, ns, "routes", routeKey("a2"), []string{host("10.7.0.1")}, nil)
	gone("routes", routeKey("a"))
	wantOutputs(v1alpha1.OutputKeys{ConfigMap: ns + "/monitor", Keys: []string{"a.monitor.conf"}},
		v1alpha1.OutputKeys{ConfigMap: ns + "/routes", Keys: []string{routeKey("a2")}})
	others()

	// 2. Renamed, and the monitor output dropped, while no controller runs.
	h.stop()
	updateRoute(t, ns, "a", func(r *v1alpha1.ModelRoute) { r.Spec.Nginx.Route, r.Spec.Monitor = "a3", nil })
	h = startManager(t, ns)
	waitKey(t, ns, "routes", routeKey("a3"), []string{host("10.7.0.1")}, nil)
	gone("routes", routeKey("a2"))
	gone("monitor", "a.monitor.conf")
	wantOutputs(v1alpha1.OutputKeys{ConfigMap: ns + "/routes", Keys: []string{routeKey("a3")}})
	others()

	// 3. Renamed and deleted while no controller runs: the finalizer
	// removes the key that was written, not only the one the spec names.
	h.stop()
	updateRoute(t, ns, "a", func(r *v1alpha1.ModelRoute) { r.Spec.Nginx.Route = "a4" })
	must(t, k8s.Delete(ctx, getRoute(t, ns, "a")))
	startManager(t, ns)
	eventually(t, "route a gone", func() (bool, string) {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "a"}, &v1alpha1.ModelRoute{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	cm, _ := getCM(t, ns, "routes")
	if want := []string{"hand.conf", routeKey("b")}; !slices.Equal(keys(cm.Data), want) {
		t.Fatalf("routes after delete: %v, want %v", keys(cm.Data), want)
	}
	others()
}

// TestOwnWriteDoesNotRequeue: a route's own ConfigMap write used to come
// back through the ConfigMap watch as a change of its key and reconcile it
// a second time for nothing. An endpoint change now costs one reconcile
// of the route; someone else's edit of its key still re-renders it.
func TestOwnWriteDoesNotRequeue(t *testing.T) {
	ns := namespace(t, "ownwrite")
	base := reconciles(t)
	h := startManager(t, ns)
	configMap(t, ns, "routes", map[string]string{"keep.conf": "x"}, nil)
	service(t, ns, "m", 8000)
	endpointSlice(t, ns, "m-a", "m", v4, 8000, up("10.9.0.1"))
	createRoute(t, newRoute(ns, "m", "m"))
	name := types.NamespacedName{Namespace: ns, Name: "m"}
	eventually(t, "the first render", func() (bool, string) {
		cm, err := getCM(t, ns, "routes")
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(cm.Data[routeKey("m")], host("10.9.0.1")), "not yet"
	})
	waitQuiet(t, h, base, nil, name)
	time.Sleep(300 * time.Millisecond) // any late echo of the write
	waitQuiet(t, h, base, nil, name)
	before, _ := h.c.started()

	endpointSlice(t, ns, "m-a", "m", v4, 8000, up("10.9.0.2"))
	eventually(t, "the new backend", func() (bool, string) {
		cm, _ := getCM(t, ns, "routes")
		return strings.Contains(cm.Data[routeKey("m")], host("10.9.0.2")), "not yet"
	})
	waitQuiet(t, h, base, before, name)
	time.Sleep(300 * time.Millisecond)
	waitQuiet(t, h, base, before, name)
	after, _ := h.c.started()
	if n := after[name] - before[name]; n != 1 {
		t.Fatalf("%d reconciles for one endpoint change, want 1 (the route's own write re-queued it)", n)
	}

	// Someone else edits the route's key (keeping its ownership mark):
	// re-rendered.
	cm, _ := getCM(t, ns, "routes")
	cm.Data[routeKey("m")] += "# edited by hand\n"
	must(t, k8s.Update(context.Background(), cm))
	eventually(t, "the key restored", func() (bool, string) {
		cm, _ := getCM(t, ns, "routes")
		v := cm.Data[routeKey("m")]
		return strings.Contains(v, host("10.9.0.2")) && !strings.Contains(v, "edited by hand"), v
	})
}

// TestStatusNotWrittenForSameCountEndpointChange: an endpoint change that
// keeps the number of backends rewrites the route's ConfigMap key but not
// its status (the status used to list the endpoints, so every rollout step
// wrote every route's status). A status left by an older version with the
// retired endpoint list loses it at the next status write.
func TestStatusNotWrittenForSameCountEndpointChange(t *testing.T) {
	ns := namespace(t, "samecount")
	base := reconciles(t)
	h := startManager(t, ns)
	configMap(t, ns, "routes", nil, nil)
	service(t, ns, "m", 8000)
	endpointSlice(t, ns, "m-a", "m", v4, 8000, up("10.8.0.1"))
	createRoute(t, newRoute(ns, "m", "m"))
	name := types.NamespacedName{Namespace: ns, Name: "m"}
	waitCondition(t, ns, "m", metav1.ConditionTrue, ReasonReconciled)
	waitQuiet(t, h, base, nil, name)
	writes := h.c.statusWrites.Load()
	before, _ := h.c.started()

	endpointSlice(t, ns, "m-a", "m", v4, 8000, up("10.8.0.2"))
	waitKey(t, ns, "routes", routeKey("m"), []string{host("10.8.0.2")}, []string{host("10.8.0.1")})
	waitQuiet(t, h, base, before, name)
	if n := h.c.statusWrites.Load() - writes; n != 0 {
		t.Fatalf("%d status writes for an endpoint change that keeps the count, want 0", n)
	}

	// An older version's status field is removed by the next status write.
	must(t, k8s.Status().Patch(context.Background(), getRoute(t, ns, "m"), client.RawPatch(types.MergePatchType, []byte(`{"status":{"backendEndpoints":["10.8.0.1:8000"]}}`))))
	endpointSlice(t, ns, "m-a", "m", v4, 8000, up("10.8.0.2", "10.8.0.3"))
	eventually(t, "the retired field gone", func() (bool, string) {
		var u unstructured.Unstructured
		u.SetGroupVersionKind(v1alpha1.SchemeGroupVersion.WithKind("ModelRoute"))
		if err := k8s.Get(context.Background(), name, &u); err != nil {
			return false, err.Error()
		}
		_, found, _ := unstructured.NestedFieldNoCopy(u.Object, "status", "backendEndpoints")
		b, _, _ := unstructured.NestedInt64(u.Object, "status", "backends")
		return !found && b == 2, fmt.Sprint(u.Object["status"])
	})
}

// TestPodsCachedOnlyWhereRoutesSelectThem: pods used to be cached
// cluster-wide from the start (most of the controller's memory at 10,000
// pods) although Service-discovery routes never read them. Now pods are
// cached only while a route selects them, per namespace and selector; the
// cache goes when the last such route does, and comes back, watched again,
// with the next one.
func TestPodsCachedOnlyWhereRoutesSelectThem(t *testing.T) {
	svcNS, selNS := namespace(t, "svconly"), namespace(t, "selpods")
	h := startManager(t, svcNS, selNS)
	for _, ns := range []string{svcNS, selNS} {
		configMap(t, ns, "routes", nil, nil)
	}
	service(t, svcNS, "m", 8000)
	endpointSlice(t, svcNS, "m-a", "m", v4, 8000, up("10.7.0.1"))
	pod(t, svcNS, "unread", map[string]string{"app": "m"}, "10.7.0.9", true, 8000)
	createRoute(t, newRoute(svcNS, "m", "m"))
	waitCondition(t, svcNS, "m", metav1.ConditionTrue, ReasonReconciled)
	if got := h.r.pods.Running(); len(got) != 0 {
		t.Fatalf("pod caches %v with only a Service-discovery route, want none", got)
	}

	app := map[string]string{"app": "sel"}
	pod(t, selNS, "sel-0", app, "10.7.1.1", true, 8000)
	selRoute := func() *v1alpha1.ModelRoute {
		return newRoute(selNS, "sel", "", func(r *v1alpha1.ModelRoute) { r.Spec.Discovery = v1alpha1.Discovery{Selector: "app=sel"} })
	}
	createRoute(t, selRoute())
	waitKey(t, selNS, "routes", routeKey("sel"), []string{host("10.7.1.1")}, nil)
	if got, want := h.r.pods.Running(), []informer.PodKey{{Namespace: selNS, Selector: "app=sel"}}; !slices.Equal(got, want) {
		t.Fatalf("pod caches %v, want only %v", got, want)
	}

	must(t, k8s.Delete(context.Background(), getRoute(t, selNS, "sel")))
	eventually(t, "the pod cache to stop", func() (bool, string) {
		got := h.r.pods.Running()
		return len(got) == 0, fmt.Sprint(got)
	})

	// Back with the next selector route, and its pod events arrive.
	createRoute(t, selRoute())
	waitKey(t, selNS, "routes", routeKey("sel"), []string{host("10.7.1.1")}, nil)
	pod(t, selNS, "sel-1", app, "10.7.1.2", true, 8000)
	waitKey(t, selNS, "routes", routeKey("sel"), []string{host("10.7.1.1"), host("10.7.1.2")}, nil)
}

// TestNodeGPULabelByService: a node's GPU label changes under a Service
// route's endpoints (informer.Routes.MapNode finds the slices with an endpoint on the
// node), and a node created after the start with the route's endpoints on
// it is rendered with its GPU type.
func TestNodeGPULabelByService(t *testing.T) {
	ns := namespace(t, "nodesvc")
	startManager(t, ns)
	node := func(name, product string) {
		must(t, k8s.Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"nvidia.com/gpu.product": product}}}))
		t.Cleanup(func() {
			_ = k8s.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
		})
	}
	n1 := ns + "-gpu-1"
	node(n1, "NVIDIA-H100-80GB-HBM3")
	service(t, ns, "qwen", 8000)
	endpointSlice(t, ns, "qwen-a", "qwen", v4, 8000, []backend{{ip: "10.6.0.1", ready: true, node: n1}})
	endpointSlice(t, ns, "other-a", "other", v4, 8000, []backend{{ip: "10.6.0.9", ready: true, node: "elsewhere"}})
	configMap(t, ns, "routes", nil, nil)
	configMap(t, ns, "monitor", nil, nil)
	createRoute(t, newRoute(ns, "qwen", "qwen", func(r *v1alpha1.ModelRoute) {
		r.Spec.Monitor = &v1alpha1.Monitor{OutputConfigMap: "monitor"}
	}))
	waitKey(t, ns, "monitor", "qwen.monitor.conf", []string{"10.6.0.1:8000", "H100"}, nil)

	var n corev1.Node
	must(t, k8s.Get(context.Background(), client.ObjectKey{Name: n1}, &n))
	n.Labels["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-80GB"
	must(t, k8s.Update(context.Background(), &n))
	waitKey(t, ns, "monitor", "qwen.monitor.conf", []string{"A100"}, []string{"H100"})

	// The slice names a node the cache does not have yet: no GPU type
	// for the route; the node's creation renders it.
	n2 := ns + "-gpu-2"
	endpointSlice(t, ns, "qwen-a", "qwen", v4, 8000, []backend{{ip: "10.6.0.2", ready: true, node: n2}})
	waitKey(t, ns, "monitor", "qwen.monitor.conf", []string{"10.6.0.2:8000", "gpu_type= "}, []string{"10.6.0.1", "A100"})
	node(n2, "NVIDIA-H100-80GB-HBM3")
	waitKey(t, ns, "monitor", "qwen.monitor.conf", []string{"gpu_type=H100"}, []string{"gpu_type= "})
}
