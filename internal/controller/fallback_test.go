package controller

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// fbEnv is a namespace, a FailOpen selector route stored in the API server
// (it needs a UID for owner references) and a Reconciler on a direct
// client with a real event recorder.
type fbEnv struct {
	ns    string
	route *v1alpha1.ModelRoute
	r     *fallbackService
}

func newFallbackEnv(t *testing.T, name string) *fbEnv {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "fb-"}}
	if err := k8s.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	route := &v1alpha1.ModelRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name}}
	route.Spec = v1alpha1.Spec{
		Discovery:   v1alpha1.Discovery{Selector: "app=tiny", Port: 8000},
		FailureMode: v1alpha1.FailOpen,
		Nginx: v1alpha1.Nginx{
			OutputConfigMap: "openresty-conf",
			Peers:           []v1alpha1.Peer{{Use: v1alpha1.UseBackend, Priority: 2}},
		},
	}
	if err := k8s.Create(ctx, route); err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(testCfg)
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	stop := make(chan struct{})
	b.StartRecordingToSink(stop)
	t.Cleanup(func() { close(stop); b.Shutdown() })
	return &fbEnv{ns: ns.Name, route: route, r: &fallbackService{client: k8s, recorder: b.NewRecorder(testScheme, Name), pods: podReader(nil, k8s)}}
}

func (e *fbEnv) reconcile(t *testing.T) (ip string, port int32) {
	t.Helper()
	vip, err := e.r.reconcile(context.Background(), e.route, e.route)
	if err != nil {
		t.Fatal(err)
	}
	if vip == nil {
		return "", 0
	}
	return vip.IP, vip.Port
}

func (e *fbEnv) svc(t *testing.T) *corev1.Service {
	t.Helper()
	var s corev1.Service
	err := k8s.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: FallbackServiceName(e.route.Name)}, &s)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &s
}

func (e *fbEnv) conflict() *metav1.Condition {
	return meta.FindStatusCondition(e.route.Status.Conditions, TypeFallbackServiceConflict)
}

// TestFallbackServiceLifecycle drives the fallback Service step on a real
// API server: created, recreated after a delete, follows selector and port
// changes, deleted on the switch to FailClose and by the finalizer path.
func TestFallbackServiceLifecycle(t *testing.T) {
	ctx := context.Background()
	e := newFallbackEnv(t, "tiny")

	ip, port := e.reconcile(t)
	s := e.svc(t)
	if s == nil {
		t.Fatal("no fallback Service created")
	}
	if ip == "" || ip != s.Spec.ClusterIP || port != 8000 {
		t.Errorf("VIP %s:%d, Service clusterIP %s", ip, port, s.Spec.ClusterIP)
	}
	if s.Spec.Type != corev1.ServiceTypeClusterIP || s.Spec.Selector["app"] != "tiny" || len(s.Spec.Selector) != 1 ||
		len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != 8000 || s.Spec.Ports[0].TargetPort.IntValue() != 8000 {
		t.Errorf("fallback Service spec %+v", s.Spec)
	}
	if !metav1.IsControlledBy(s, e.route) || s.Labels[ManagedByLabel] != ManagedByValue || s.Annotations[FallbackForAnnotation] != e.ns+"/tiny" {
		t.Errorf("fallback Service not marked as owned: owners %v labels %v annotations %v", s.OwnerReferences, s.Labels, s.Annotations)
	}
	rv := s.ResourceVersion

	// A second reconcile with nothing changed writes nothing.
	e.reconcile(t)
	if got := e.svc(t).ResourceVersion; got != rv {
		t.Errorf("no-op reconcile updated the Service (resourceVersion %s → %s)", rv, got)
	}

	// Deleted by someone: recreated.
	if err := k8s.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Service to be gone", func() (bool, string) { return e.svc(t) == nil, "still there" })
	if ip, _ := e.reconcile(t); ip == "" {
		t.Error("no VIP after recreation")
	}
	s2 := e.svc(t)
	if s2 == nil || s2.UID == s.UID {
		t.Fatalf("fallback Service not recreated: %v", s2)
	}

	// Selector and port follow the spec.
	e.route.Spec.Discovery = v1alpha1.Discovery{Selector: "app in (tiny2),tier==gpu", Port: 9000}
	if _, port := e.reconcile(t); port != 9000 {
		t.Errorf("VIP port %d after the change, want 9000", port)
	}
	s3 := e.svc(t)
	if s3.UID != s2.UID || s3.Spec.Selector["app"] != "tiny2" || s3.Spec.Selector["tier"] != "gpu" || len(s3.Spec.Selector) != 2 ||
		s3.Spec.Ports[0].Port != 9000 || s3.Spec.Ports[0].TargetPort.IntValue() != 9000 || s3.Spec.ClusterIP != s2.Spec.ClusterIP {
		t.Errorf("Service not updated in place: uid %s→%s selector %v ports %+v clusterIP %s→%s",
			s2.UID, s3.UID, s3.Spec.Selector, s3.Spec.Ports, s2.Spec.ClusterIP, s3.Spec.ClusterIP)
	}

	// Port derived from the pods' single containerPort when unset.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "p", Labels: map[string]string{"app": "tiny2", "tier": "gpu"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm", Ports: []corev1.ContainerPort{{ContainerPort: 8001}}}}}}
	if err := k8s.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	e.route.Spec.Discovery.Port = 0
	if _, port := e.reconcile(t); port != 8001 || e.svc(t).Spec.Ports[0].TargetPort.IntValue() != 8001 {
		t.Errorf("derived port %d, Service %+v; want 8001", port, e.svc(t).Spec.Ports)
	}

	// A set-based selector cannot be a Service selector: reported, the
	// existing Service stays as it was.
	e.route.Spec.Discovery.Selector = "app notin (x)"
	if ip, _ := e.reconcile(t); ip != "" {
		t.Errorf("VIP %s for an inexpressible selector", ip)
	}
	if c := e.conflict(); c == nil || c.Reason != ReasonSelectorNotExpressible {
		t.Errorf("condition %+v, want %s", c, ReasonSelectorNotExpressible)
	}
	e.route.Spec.Discovery.Selector = "app=tiny2,tier=gpu"
	e.reconcile(t)
	if c := e.conflict(); c != nil {
		t.Errorf("condition %+v still set after the selector was fixed", c)
	}

	// Switch to FailClose: deleted.
	e.route.Spec.FailureMode = v1alpha1.FailClose
	if ip, _ := e.reconcile(t); ip != "" {
		t.Errorf("FailClose got VIP %s", ip)
	}
	eventually(t, "the Service deleted on FailClose", func() (bool, string) { return e.svc(t) == nil, "still there" })

	// Back to FailOpen, then the route goes away (finalizer path).
	e.route.Spec.FailureMode = v1alpha1.FailOpen
	e.reconcile(t)
	if e.svc(t) == nil {
		t.Fatal("not recreated after switching back to FailOpen")
	}
	if err := e.r.cleanup(ctx, e.route); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Service deleted with the route", func() (bool, string) { return e.svc(t) == nil, "still there" })
}

// TestFallbackServiceForeign: a same-named Service the route does not own
// is never modified or deleted; the route reports FallbackServiceConflict
// with a Warning event, renders no VIP, and takes over the name only after
// that Service is gone.
func TestFallbackServiceForeign(t *testing.T) {
	ctx := context.Background()
	e := newFallbackEnv(t, "qwen")
	foreign := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "qwen-fallback", Labels: map[string]string{"team": "other"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "other"},
			Ports: []corev1.ServicePort{{Port: 1234}}},
	}
	if err := k8s.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	rv := e.svc(t).ResourceVersion
	for i := 0; i < 2; i++ {
		if ip, _ := e.reconcile(t); ip != "" {
			t.Errorf("a foreign Service's VIP %s was used", ip)
		}
	}
	c := e.conflict()
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonServiceNotOwned || !strings.Contains(c.Message, "qwen-fallback") {
		t.Fatalf("condition %+v, want %s/%s naming the Service", c, TypeFallbackServiceConflict, ReasonServiceNotOwned)
	}
	// Not touched by the FailOpen reconcile, by the switch to FailClose,
	// nor by the finalizer path.
	e.route.Spec.FailureMode = v1alpha1.FailClose
	e.reconcile(t)
	if err := e.r.cleanup(ctx, e.route); err != nil {
		t.Fatal(err)
	}
	if s := e.svc(t); s == nil || s.ResourceVersion != rv || s.Spec.Selector["app"] != "other" {
		t.Fatalf("foreign Service modified or deleted: %+v", s)
	}
	if e.conflict() != nil {
		t.Error("condition kept after the route stopped wanting a fallback")
	}
	// One Warning event, on the route (transitions only: two conflicting
	// reconciles gave one event).
	eventually(t, "the FallbackServiceConflict event", func() (bool, string) {
		var l eventsv1.EventList
		if err := k8s.List(ctx, &l, client.InNamespace(e.ns)); err != nil {
			return false, err.Error()
		}
		n := 0
		for _, ev := range l.Items {
			if ev.Reason == TypeFallbackServiceConflict && ev.Regarding.Name == "qwen" && ev.Type == corev1.EventTypeWarning {
				n++
			}
		}
		return n == 1, "events: " + strings.Repeat("*", n)
	})

	// The foreign Service goes away: the route creates its own.
	e.route.Spec.FailureMode = v1alpha1.FailOpen
	if err := k8s.Delete(ctx, e.svc(t)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the foreign Service gone", func() (bool, string) { return e.svc(t) == nil, "still there" })
	if ip, _ := e.reconcile(t); ip == "" || !metav1.IsControlledBy(e.svc(t), e.route) || e.conflict() != nil {
		t.Errorf("after the foreign Service left: VIP %q, condition %+v", ip, e.conflict())
	}
}

// TestFallbackServiceName: always a valid Service name, distinct per route.
func TestFallbackServiceName(t *testing.T) {
	seen := map[string]string{}
	for _, route := range []string{
		"tiny", "qwen-72b", "qwen.v2", "Qwen", "7b-model", "a_b", strings.Repeat("m", 54), strings.Repeat("m", 55),
		strings.Repeat("m", 253), strings.Repeat("m", 252) + "x", "...", "0", "9.9",
	} {
		n := FallbackServiceName(route)
		if errs := validation.IsDNS1035Label(n); len(errs) > 0 {
			t.Errorf("%q → %q: %v", route, n, errs)
		}
		if other, dup := seen[n]; dup {
			t.Errorf("%q and %q share %q", route, other, n)
		}
		seen[n] = route
	}
	if got := FallbackServiceName("qwen-72b"); got != "qwen-72b-fallback" {
		t.Errorf("plain name rewritten: %q", got)
	}
}

// TestFallbackServiceEndToEnd runs the whole controller (manager, watches,
// finalizer) on a real API server: the fallback Service appears and its
// ClusterIP reaches the route file's backend-svc tier; deleted, it comes
// back through the Service watch; FailClose removes it; deleting the route
// removes it before the finalizer goes.
func TestFallbackServiceEndToEnd(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "fbe2e")
	startManager(t, ns)
	configMap(t, ns, "routes", nil, nil)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vllm-0", Labels: map[string]string{"app": "tiny"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm", Ports: []corev1.ContainerPort{{ContainerPort: 8000}}}}}}
	must(t, k8s.Create(ctx, pod))
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.0.7", PodIPs: []corev1.PodIP{{IP: "10.1.0.7"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	must(t, k8s.Status().Update(ctx, pod))
	createRoute(t, newRoute(ns, "tiny", "", func(r *v1alpha1.ModelRoute) {
		r.Spec.Discovery = v1alpha1.Discovery{Selector: "app=tiny"}
		r.Spec.FailureMode = v1alpha1.FailOpen
	}))
	e := &fbEnv{ns: ns, route: &v1alpha1.ModelRoute{ObjectMeta: metav1.ObjectMeta{Name: "tiny"}}}
	vipInFile := func() (string, bool) {
		s := e.svc(t)
		if s == nil {
			return "no Service", false
		}
		file, _ := cmKey(t, ns, "routes", routeKey("tiny"))
		return s.Spec.ClusterIP, strings.Contains(file, `"backend-svc"`) && strings.Contains(file, host(s.Spec.ClusterIP)) && strings.Contains(file, host("10.1.0.7"))
	}
	eventually(t, "fallback Service and its VIP in the route file", func() (bool, string) { ip, ok := vipInFile(); return ok, ip })
	first := e.svc(t)

	must(t, k8s.Delete(ctx, first))
	eventually(t, "fallback Service recreated and rendered", func() (bool, string) {
		s := e.svc(t)
		if s == nil {
			return false, "not recreated yet"
		}
		ip, ok := vipInFile()
		return ok && s.UID != first.UID, ip
	})

	updateRoute(t, ns, "tiny", func(r *v1alpha1.ModelRoute) { r.Spec.FailureMode = v1alpha1.FailClose })
	eventually(t, "fallback Service deleted on FailClose", func() (bool, string) { return e.svc(t) == nil, "still there" })
	updateRoute(t, ns, "tiny", func(r *v1alpha1.ModelRoute) { r.Spec.FailureMode = v1alpha1.FailOpen })
	eventually(t, "fallback Service back on FailOpen", func() (bool, string) { ip, ok := vipInFile(); return ok, ip })

	must(t, k8s.Delete(ctx, getRoute(t, ns, "tiny")))
	eventually(t, "route and fallback Service gone", func() (bool, string) {
		var r v1alpha1.ModelRoute
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tiny"}, &r)
		return apierrors.IsNotFound(err) && e.svc(t) == nil, "route or Service still there"
	})
}

// TestFallbackServiceUpgradeFromUpdate: a fallback Service an earlier
// autoconfig created with a plain create (manager FieldOwner, operation
// Update) follows a port change under server-side apply: the old port is
// replaced, not kept next to the new one.
func TestFallbackServiceUpgradeFromUpdate(t *testing.T) {
	ctx := context.Background()
	e := newFallbackEnv(t, "tiny")
	old := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: FallbackServiceName("tiny"),
			Labels: map[string]string{ManagedByLabel: ManagedByValue}, Annotations: map[string]string{FallbackForAnnotation: e.ns + "/tiny"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Selector: map[string]string{"app": "tiny"},
			Ports: []corev1.ServicePort{{Name: FallbackPortName, Protocol: corev1.ProtocolTCP, Port: 8000, TargetPort: intstr.FromInt32(8000)}}},
	}
	if err := ctrl.SetControllerReference(e.route, old, k8s.Scheme()); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, old, client.FieldOwner(FieldOwner)); err != nil {
		t.Fatal(err)
	}
	e.route.Spec.Discovery.Port = 9000
	if _, port := e.reconcile(t); port != 9000 {
		t.Fatalf("VIP port %d, want 9000", port)
	}
	s := e.svc(t)
	if s.UID != old.UID || len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != 9000 || s.Spec.Ports[0].TargetPort.IntValue() != 9000 {
		t.Fatalf("Service after the port change: uid %s→%s ports %+v", old.UID, s.UID, s.Spec.Ports)
	}
}
