package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TestTooLargeExactlyTheRoutesNotWritten: a shared ConfigMap with little
// room left. The routes whose file fits are written and Ready; every
// other one is Ready=False OutputTooLarge, with the sizes in the message,
// and its key is absent. Freeing the space makes all of them Ready.
func TestTooLargeExactlyTheRoutesNotWritten(t *testing.T) {
	ns := namespace(t, "toolarge")
	startManager(t)
	service(t, ns, "m", 8000)
	endpointSlice(t, ns, "m-1", "m", v4, 8000, up("10.36.0.1", "10.36.0.2"))
	// One route's file is about 2.6 KiB: leave room for about three.
	filler := strings.Repeat("#", sink.MaxSize-8<<10)
	configMap(t, ns, "routes", map[string]string{"bulk.conf": filler}, nil)
	names := []string{"r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8"}
	for _, n := range names {
		createRoute(t, newRoute(ns, n, "m"))
	}
	written, refused := 0, 0
	eventually(t, "every route settled", func() (bool, string) {
		written, refused = 0, 0
		var state []string
		for _, n := range names {
			c := findCond(getRoute(t, ns, n), TypeReady)
			if c == nil {
				return false, n + " has no Ready"
			}
			_, has := cmKey(t, ns, "routes", routeKey(n))
			switch {
			case c.Status == metav1.ConditionTrue && has:
				written++
			case c.Status == metav1.ConditionFalse && c.Reason == ReasonOutputTooLarge && !has:
				refused++
				if !strings.Contains(c.Message, "over the 1.00 MiB limit") || !strings.Contains(c.Message, "bulk.conf (") {
					return false, "message: " + c.Message
				}
			default:
				state = append(state, fmt.Sprintf("%s %s/%s key=%v", n, c.Status, c.Reason, has))
			}
		}
		return len(state) == 0, strings.Join(state, "; ")
	})
	t.Logf("%d routes written, %d refused as too large", written, refused)
	if written == 0 || refused == 0 {
		t.Fatalf("%d written, %d refused: the filler does not split the routes", written, refused)
	}
	// Space is freed: every refused route is written without a route change.
	cm, err := getCM(t, ns, "routes")
	must(t, err)
	cm.Data["bulk.conf"] = "#"
	must(t, k8s.Update(context.Background(), cm))
	for _, n := range names {
		waitCondition(t, ns, n, metav1.ConditionTrue, ReasonReconciled)
		waitKey(t, ns, "routes", routeKey(n), []string{host("10.36.0.1")}, nil)
	}
}

// TestSkippedTierDegraded: the CART Service is missing, so the cart tier
// is skipped: Ready stays True (the backend tier serves), Degraded=True
// TierSkipped says which tier and why; creating the Service clears it.
func TestSkippedTierDegraded(t *testing.T) {
	ns := namespace(t, "degraded")
	startManager(t)
	configMap(t, ns, "routes", map[string]string{}, nil)
	configMap(t, ns, "cart", map[string]string{"config.yaml": "workers: []\n"}, nil)
	service(t, ns, "m", 8000)
	endpointSlice(t, ns, "m-1", "m", v4, 8000, up("10.37.0.1"))
	createRoute(t, newRoute(ns, "m", "m", func(r *v1alpha1.ModelRoute) {
		r.Spec.Cart = &v1alpha1.Cart{Discovery: v1alpha1.Discovery{Service: "cart"}, OutputConfigMap: "cart"}
		r.Spec.Nginx.Peers = []v1alpha1.Peer{{Use: v1alpha1.UseCart, Priority: 3}, {Use: v1alpha1.UseBackend, Priority: 2}}
	}))
	r := waitCondition(t, ns, "m", metav1.ConditionTrue, ReasonReconciled)
	d := findCond(r, TypeDegraded)
	if d == nil || d.Status != metav1.ConditionTrue || d.Reason != ReasonTierSkipped ||
		!strings.Contains(d.Message, "spec.nginx.peers[0] (use: cart) skipped") || !strings.Contains(d.Message, "Service "+ns+"/cart does not exist") {
		t.Fatalf("Degraded: %+v", d)
	}
	service(t, ns, "cart", 9000)
	eventually(t, "Degraded cleared", func() (bool, string) {
		r := getRoute(t, ns, "m")
		return findCond(r, TypeDegraded) == nil, fmt.Sprint(r.Status.Conditions)
	})
}

// TestUnwatchedNamespace: a route that references a namespace outside
// --namespace says so, in the user's terms, with a Warning event.
func TestUnwatchedNamespace(t *testing.T) {
	ns, other := namespace(t, "watched"), namespace(t, "unwatched")
	startManager(t, ns)
	configMap(t, ns, "routes", map[string]string{}, nil)
	service(t, other, "m", 8000)
	createRoute(t, newRoute(ns, "m", other+"/m"))
	r := waitCondition(t, ns, "m", metav1.ConditionFalse, ReasonNamespaceNotWatched)
	want := fmt.Sprintf("namespace %s is not watched by this controller (--namespace %s), so %s/m cannot be read or written: add %s to --namespace", other, ns, other, other)
	if c := findCond(r, TypeReady); !strings.Contains(c.Message, want) {
		t.Errorf("message %q lacks %q", c.Message, want)
	}
	if c := findCond(r, TypeStalled); c == nil || c.Reason != ReasonNamespaceNotWatched {
		t.Errorf("Stalled: %+v", c)
	}
	waitEvent(t, ns, "m", ReasonNamespaceNotWatched)
}

// TestAllProblemsAtOnce: a missing Service, a missing ConfigMap and a
// ConfigMap that does not allow the route are reported in one condition;
// the Service is reported as missing, not as "no ready backends".
func TestAllProblemsAtOnce(t *testing.T) {
	ns, mon := namespace(t, "problems"), namespace(t, "problems-mon")
	startManager(t)
	configMap(t, mon, "monitor", map[string]string{}, nil)
	createRoute(t, newRoute(ns, "m", "nosuch", func(r *v1alpha1.ModelRoute) {
		r.Spec.Monitor = &v1alpha1.Monitor{OutputConfigMap: mon + "/monitor"}
	}))
	r := waitCondition(t, ns, "m", metav1.ConditionFalse, ReasonServiceNotFound)
	msg := findCond(r, TypeReady).Message
	for _, want := range []string{
		"3 problems",
		"ServiceNotFound: Service " + ns + "/nosuch (spec.discovery.service) does not exist",
		"OutputConfigMapMissing: ConfigMap " + ns + "/routes does not exist",
		"NotPermitted: ConfigMap " + mon + "/monitor is in another namespace",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, ReasonNoBackends) {
		t.Errorf("a missing Service reported as no backends: %s", msg)
	}
	// Fixing them one by one: each fix removes its problem.
	service(t, ns, "nosuch", 8000)
	endpointSlice(t, ns, "nosuch-1", "nosuch", v4, 8000, up("10.38.0.1"))
	r = waitCondition(t, ns, "m", metav1.ConditionFalse, ReasonOutputConfigMapMissing)
	if msg := findCond(r, TypeReady).Message; !strings.Contains(msg, "2 problems") || !strings.Contains(msg, "NotPermitted") {
		t.Errorf("after the Service: %s", msg)
	}
	configMap(t, ns, "routes", nil, nil)
	waitCondition(t, ns, "m", metav1.ConditionFalse, ReasonNotPermitted)
	cm, err := getCM(t, mon, "monitor")
	must(t, err)
	cm.Annotations = map[string]string{sink.AllowedNamespacesAnnotation: ns}
	must(t, k8s.Update(context.Background(), cm))
	waitCondition(t, ns, "m", metav1.ConditionTrue, ReasonReconciled)
}

// TestOutputForbidden: with an identity whose RBAC lets it read every
// ConfigMap but patch them only in one namespace, the route whose
// ConfigMap is elsewhere is Ready=False OutputForbidden (not Retrying),
// saying what to grant; once granted, the next event writes it.
func TestOutputForbidden(t *testing.T) {
	ok, denied := namespace(t, "rbac-ok"), namespace(t, "rbac-denied")
	ctx := context.Background()
	user := "autoconfig-" + denied
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{v1alpha1.Group}, Resources: []string{"modelroutes", "modelroutes/status"}, Verbs: []string{"patch", "update"}},
		{APIGroups: []string{"events.k8s.io", ""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
	must(t, k8s.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: rules}))
	must(t, k8s.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: user, APIGroup: rbacv1.GroupName}},
	}))
	grant := func(ns string) {
		must(t, k8s.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "patch-cm"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"patch"}}},
		}))
		must(t, k8s.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "patch-cm"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "patch-cm"},
			Subjects:   []rbacv1.Subject{{Kind: "User", Name: user, APIGroup: rbacv1.GroupName}},
		}))
	}
	grant(ok)
	cfg := rest.CopyConfig(testCfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	h := newHarnessAs(t, cfg)
	t.Cleanup(h.stop)
	for _, ns := range []string{ok, denied} {
		configMap(t, ns, "routes", map[string]string{}, nil)
		service(t, ns, "m", 8000)
		endpointSlice(t, ns, "m-1", "m", v4, 8000, up("10.39.0.1"))
		createRoute(t, newRoute(ns, "m", "m"))
	}
	waitCondition(t, ok, "m", metav1.ConditionTrue, ReasonReconciled)
	r := waitCondition(t, denied, "m", metav1.ConditionFalse, ReasonOutputForbidden)
	msg := findCond(r, TypeReady).Message
	for _, want := range []string{"does not let the controller write ConfigMap " + denied + "/routes", `cannot patch resource "configmaps"`, "in namespace " + denied} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q: %s", want, msg)
		}
	}
	waitEvent(t, denied, "m", ReasonOutputForbidden)
	grant(denied)
	updateRoute(t, denied, "m", func(r *v1alpha1.ModelRoute) { r.Spec.Nginx.Values = map[string]string{"default_max": "5"} })
	waitCondition(t, denied, "m", metav1.ConditionTrue, ReasonReconciled)
	waitKey(t, denied, "routes", routeKey("m"), []string{host("10.39.0.1")}, nil)
}

// TestMonitorNeverInNginxConfigMap: openresty includes every *.conf key of
// its ConfigMap, so a monitor file there would break the shared nginx. A
// route naming its own nginx ConfigMap in another form (name vs ns/name:
// the API server's rules cannot read metadata.namespace, so it stores the
// route) is InvalidSpec, as `autoconfig vet` and `cue vet` judge it, and
// writes nothing; a route whose monitor ConfigMap becomes another route's
// nginx ConfigMap removes the monitor file it wrote and says so.
func TestMonitorNeverInNginxConfigMap(t *testing.T) {
	ns := namespace(t, "moninngx")
	startManager(t)
	configMap(t, ns, "routes", map[string]string{}, nil)
	configMap(t, ns, "mon", map[string]string{}, nil)
	service(t, ns, "m", 8000)
	endpointSlice(t, ns, "m-1", "m", v4, 8000, up("10.40.0.1"))
	createRoute(t, newRoute(ns, "self", "m", func(r *v1alpha1.ModelRoute) {
		r.Spec.Monitor = &v1alpha1.Monitor{OutputConfigMap: ns + "/routes"}
	}))
	r := waitCondition(t, ns, "self", metav1.ConditionFalse, ReasonInvalidSpec)
	want := "spec.monitor.outputConfigMap: monitor.outputConfigMap is the nginx outputConfigMap (in the route's namespace " + ns + " both are ConfigMap " + ns + "/routes)"
	if msg := findCond(r, TypeReady).Message; !strings.Contains(msg, want) {
		t.Errorf("message: %s\nwant it to contain: %s", msg, want)
	}
	for _, key := range []string{routeKey("self"), "self.monitor.conf"} {
		if _, ok := cmKey(t, ns, "routes", key); ok {
			t.Errorf("key %s written for an invalid route", key)
		}
	}

	createRoute(t, newRoute(ns, "mon", "m", func(r *v1alpha1.ModelRoute) {
		r.Spec.Monitor = &v1alpha1.Monitor{OutputConfigMap: "mon"}
	}))
	waitCondition(t, ns, "mon", metav1.ConditionTrue, ReasonReconciled)
	waitKey(t, ns, "mon", "mon.monitor.conf", []string{"10.40.0.1"}, nil)
	// Another route now writes its nginx file into "mon".
	createRoute(t, newRoute(ns, "intruder", "m", func(r *v1alpha1.ModelRoute) { r.Spec.Nginx.OutputConfigMap = "mon" }))
	r = waitCondition(t, ns, "mon", metav1.ConditionFalse, ReasonMonitorInNginxConfigMap)
	if msg := findCond(r, TypeReady).Message; !strings.Contains(msg, "ModelRoute "+ns+"/intruder") {
		t.Errorf("message: %s", msg)
	}
	eventually(t, "the monitor file removed from the nginx ConfigMap", func() (bool, string) {
		_, ok := cmKey(t, ns, "mon", "mon.monitor.conf")
		return !ok, "still there"
	})
}

// TestByteOrderMarkValue: a value with U+FEFF, which the API server and
// `autoconfig vet` accept, is valid for the controller too (it used to
// fail its JSON step and retry forever) and reaches the route file.
func TestByteOrderMarkValue(t *testing.T) {
	ns := namespace(t, "bom")
	startManager(t)
	configMap(t, ns, "routes", map[string]string{}, nil)
	service(t, ns, "m", 8000)
	endpointSlice(t, ns, "m-1", "m", v4, 8000, up("10.41.0.1"))
	createRoute(t, newRoute(ns, "m", "m", func(r *v1alpha1.ModelRoute) {
		r.Spec.Nginx.Values = map[string]string{"note": "a\ufeffb"}
	}))
	waitCondition(t, ns, "m", metav1.ConditionTrue, ReasonReconciled)
	waitKey(t, ns, "routes", routeKey("m"), []string{`"a\239\187\191b"`}, nil)
}
