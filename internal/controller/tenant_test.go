package controller

import (
	"context"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// tenantClient is a user who may manage ModelRoutes (and read
// ConfigMaps) in ns only, as a tenant of a shared cluster is.
func tenantClient(t *testing.T, user, ns string) client.Client {
	t.Helper()
	ctx := context.Background()
	must(t, k8s.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{v1alpha1.Group}, Resources: []string{"modelroutes"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}},
		},
	}))
	must(t, k8s.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tenant"},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: user, APIGroup: rbacv1.GroupName}},
	}))
	cfg := rest.CopyConfig(testCfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := client.New(cfg, client.Options{Scheme: testScheme})
	must(t, err)
	eventually(t, "the tenant's Role in effect", func() (bool, string) {
		err := c.List(ctx, &v1alpha1.ModelRouteList{}, client.InNamespace(ns))
		return err == nil, "list: " + errString(err)
	})
	return c
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestTenantCannotBorrowTheControllersReads: a tenant who may only manage
// ModelRoutes in attack-a cannot read the victim namespace's endpoints;
// a route naming victim/secret-db must not read them for it. The route is
// NotPermitted naming the grant, status and outputs carry nothing of the
// victim's; once the victim grants attack-a, the route works. A victim
// ConfigMap that has not opted in is not written either.
func TestTenantCannotBorrowTheControllersReads(t *testing.T) {
	attack, victim := namespace(t, "attack-a"), namespace(t, "victim")
	startManager(t)
	service(t, victim, "secret-db", 5432)
	endpointSlice(t, victim, "secret-db-1", "secret-db", v4, 5432, up("10.66.0.5"))
	configMap(t, attack, "routes", map[string]string{}, nil)
	configMap(t, victim, "openresty", map[string]string{"nginx.conf": "events {}\n"}, nil)
	tenant := tenantClient(t, "tenant-"+attack, attack)
	ctx := context.Background()

	// The tenant cannot read the victim's endpoints directly.
	if err := tenant.List(ctx, &discoveryv1.EndpointSliceList{}, client.InNamespace(victim)); !apierrors.IsForbidden(err) {
		t.Fatalf("the tenant lists the victim's EndpointSlices: %v", err)
	}
	must(t, tenant.Create(ctx, newRoute(attack, "steal", victim+"/secret-db")))
	r := waitCondition(t, attack, "steal", metav1.ConditionFalse, ReasonNotPermitted)
	msg := findCond(r, TypeReady).Message
	for _, want := range []string{"Service " + victim + "/secret-db (spec.discovery.service)", "has not granted namespace " + attack, "routing.modelsphere.dev/allowed-route-namespaces", "--trusted-namespace"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q: %s", want, msg)
		}
	}
	if r.Status.Backends != 0 || strings.Contains(msg, "10.66.0.5") {
		t.Errorf("the victim's endpoints leaked into status: %+v", r.Status)
	}
	if v, ok := cmKey(t, attack, "routes", routeKey("steal")); ok {
		t.Errorf("route file written from the victim's endpoints:\n%s", v)
	}

	// A route writing into the victim's ConfigMap: nothing written.
	service(t, attack, "mine", 8000)
	endpointSlice(t, attack, "mine-1", "mine", v4, 8000, up("10.66.1.1"))
	must(t, tenant.Create(ctx, newRoute(attack, "clobber", "mine", func(r *v1alpha1.ModelRoute) {
		r.Spec.Nginx.OutputConfigMap = victim + "/openresty"
	})))
	waitCondition(t, attack, "clobber", metav1.ConditionFalse, ReasonNotPermitted)
	if cm, err := getCM(t, victim, "openresty"); err != nil || len(cm.Data) != 1 || cm.Data["nginx.conf"] != "events {}\n" {
		t.Errorf("victim ConfigMap changed: %v %v", cm.Data, err)
	}

	// The victim grants attack-a: now the route may read the Service.
	grantService(t, victim, "secret-db", attack)
	r = waitCondition(t, attack, "steal", metav1.ConditionTrue, ReasonReconciled)
	if r.Status.Backends != 1 {
		t.Errorf("after the grant: %+v", r.Status)
	}
	if v, _ := cmKey(t, attack, "routes", routeKey("steal")); !strings.Contains(v, "10.66.0.5") {
		t.Errorf("after the grant the route file lacks the backend:\n%s", v)
	}
}

// TestTrustedNamespaceNeedsNoGrant: the platform team's central route
// namespace (--trusted-namespace) reads and writes across namespaces
// without grants, as the samples' central deployment does.
func TestTrustedNamespaceNeedsNoGrant(t *testing.T) {
	central, models, mon := namespace(t, "central"), namespace(t, "models"), namespace(t, "mon")
	h := newHarnessWith(t, []string{central}, nil)
	t.Cleanup(h.stop)
	service(t, models, "qwen", 8000)
	endpointSlice(t, models, "qwen-1", "qwen", v4, 8000, up("10.67.0.1"))
	configMap(t, central, "routes", map[string]string{}, nil)
	configMap(t, mon, "monitor", map[string]string{}, nil)
	createRoute(t, newRoute(central, "qwen", models+"/qwen", func(r *v1alpha1.ModelRoute) {
		r.Spec.Monitor = &v1alpha1.Monitor{OutputConfigMap: mon + "/monitor"}
	}))
	waitCondition(t, central, "qwen", metav1.ConditionTrue, ReasonReconciled)
	waitKey(t, mon, "monitor", "qwen.monitor.conf", []string{"10.67.0.1"}, nil)
}

// TestRevokedGrantKeepsTheLastOutput: revoking a grant does not take back
// what a route wrote while it held it (docs/controller.md "Cross-namespace
// references"). A canary Service of another namespace whose grant is
// revoked turns the route NotPermitted, and the pushed peers table keeps
// the canary's pods (nothing is written, nothing removed) until the route
// stops naming the Service: without spec.canary the table is the stable
// version's alone. A ConfigMap of another namespace whose grant is revoked
// keeps the route's key even when the route is deleted: the controller
// may not touch that ConfigMap any more.
func TestRevokedGrantKeepsTheLastOutput(t *testing.T) {
	ns, models, gw := namespace(t, "revoke"), namespace(t, "revoke-models"), namespace(t, "revoke-gw")
	startManager(t)
	ctx := context.Background()
	configMap(t, ns, "routes", nil, map[string]string{peers.Annotation: "true"})
	service(t, ns, "qwen", 8000)
	endpointSlice(t, ns, "qwen-a", "qwen", v4, 8000, up("10.68.0.1"))
	service(t, models, "qwen-v2", 8000)
	endpointSlice(t, models, "qwen-v2-a", "qwen-v2", v4, 8000, up("10.68.1.1"))
	grantService(t, models, "qwen-v2", ns)
	createRoute(t, newRoute(ns, "qwen", "qwen", func(r *v1alpha1.ModelRoute) {
		r.Spec.Canary = &v1alpha1.Canary{Discovery: v1alpha1.Discovery{Service: models + "/qwen-v2"}, Weight: 10}
	}))
	stable, canary := `"host":"10.68.0.1"`, `"host":"10.68.1.1"`
	waitKey(t, ns, "routes", peers.Key("qwen"), []string{stable, canary}, nil)
	waitCondition(t, ns, "qwen", metav1.ConditionTrue, ReasonReconciled)

	// The models namespace revokes the grant.
	grantService(t, models, "qwen-v2", "")
	r := waitCondition(t, ns, "qwen", metav1.ConditionFalse, ReasonNotPermitted)
	if msg := findCond(r, TypeReady).Message; !strings.Contains(msg, "Service "+models+"/qwen-v2 (spec.canary.discovery.service)") {
		t.Errorf("message: %s", msg)
	}
	if v, _ := cmKey(t, ns, "routes", peers.Key("qwen")); !strings.Contains(v, canary) {
		t.Fatalf("the peers table lost the canary's pods after the revocation; the controller should have written nothing:\n%s", v)
	}
	// The route's owner removes the canary: the table is rewritten.
	updateRoute(t, ns, "qwen", func(r *v1alpha1.ModelRoute) { r.Spec.Canary = nil })
	waitKey(t, ns, "routes", peers.Key("qwen"), []string{stable}, []string{canary})
	waitCondition(t, ns, "qwen", metav1.ConditionTrue, ReasonReconciled)

	// A ConfigMap of another namespace: written while granted, kept after
	// the grant is revoked, also when the route is deleted.
	configMap(t, gw, "openresty", nil, map[string]string{sink.AllowedNamespacesAnnotation: ns})
	createRoute(t, newRoute(ns, "edge", "qwen", func(r *v1alpha1.ModelRoute) { r.Spec.Nginx.OutputConfigMap = gw + "/openresty" }))
	waitKey(t, gw, "openresty", routeKey("edge"), []string{host("10.68.0.1")}, nil)
	must(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := getCM(t, gw, "openresty")
		if err != nil {
			return err
		}
		delete(cm.Annotations, sink.AllowedNamespacesAnnotation)
		return k8s.Update(ctx, cm)
	}))
	waitCondition(t, ns, "edge", metav1.ConditionFalse, ReasonNotPermitted)
	must(t, k8s.Delete(ctx, getRoute(t, ns, "edge")))
	eventually(t, "the route deleted", func() (bool, string) {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "edge"}, &v1alpha1.ModelRoute{})
		return apierrors.IsNotFound(err), "still there: " + errString(err)
	})
	if _, ok := cmKey(t, gw, "openresty", routeKey("edge")); !ok {
		t.Fatal("the key was removed from a ConfigMap that no longer grants the route's namespace")
	}
}
