package controller

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// keyWrites counts, from a raw watch, every change of one ConfigMap key,
// by the route whose mark the new value carries: each is a consumer reload.
type keyWrites struct {
	mu sync.Mutex
	by map[string]int
}

func watchKey(t *testing.T, ns, cm, key string) *keyWrites {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(testCfg)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + cm})
	if err != nil {
		t.Fatal(err)
	}
	kw := &keyWrites{by: map[string]int{}}
	go func() {
		last, seen := "", false
		for ev := range w.ResultChan() {
			c, ok := ev.Object.(*corev1.ConfigMap)
			if !ok || ev.Type == watch.Bookmark {
				continue
			}
			v := c.Data[key]
			if seen && v != last {
				kw.mu.Lock()
				kw.by[compiler.ReadContent(key, []byte(v)).Owner]++
				kw.mu.Unlock()
			}
			last, seen = v, true
		}
	}()
	return kw
}

func (k *keyWrites) snapshot() map[string]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string]int{}
	for r, n := range k.by {
		out[r] = n
	}
	return out
}

// raceWindow is how long the two-tenant race is observed: 10 s, or
// AUTOCONFIG_RACE_WINDOW (a Go duration) for the measurement in the docs.
func raceWindow(t *testing.T) time.Duration {
	if s := os.Getenv("AUTOCONFIG_RACE_WINDOW"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	return 10 * time.Second
}

func owner(t *testing.T, ns, cm, key string) string {
	t.Helper()
	v, ok := cmKey(t, ns, cm, key)
	if !ok {
		return "<absent>"
	}
	return compiler.ReadContent(key, []byte(v)).Owner
}

func warningEvents(t *testing.T, ns, route, reason string) int {
	t.Helper()
	var l eventsv1.EventList
	must(t, k8s.List(context.Background(), &l, client.InNamespace(ns)))
	n := 0
	for _, e := range l.Items {
		if e.Regarding.Name == route && e.Reason == reason && e.Type == corev1.EventTypeWarning {
			n++
		}
	}
	return n
}

// TestTwoNamespacesRaceForOneKey: two tenants' routes render the same
// nginx.route into one shared openresty ConfigMap. The older one keeps the
// key; the other writes nothing over the whole window, is Ready=False
// OutputConflict naming the owner, with one Warning event; when the owner
// is deleted, the other takes the key over.
func TestTwoNamespacesRaceForOneKey(t *testing.T) {
	a, b, gw := namespace(t, "race-a"), namespace(t, "race-b"), namespace(t, "race-gw")
	startManager(t)
	configMap(t, gw, "openresty", map[string]string{"nginx.conf": "# the consumer's own\n"}, map[string]string{sink.AllowedNamespacesAnnotation: a + "," + b})
	for i, ns := range []string{a, b} {
		service(t, ns, "m", 8000)
		endpointSlice(t, ns, "m-1", "m", v4, 8000, up(fmt.Sprintf("10.31.%d.1", i)))
	}
	shared := func(r *v1alpha1.ModelRoute) {
		r.Spec.Nginx.OutputConfigMap = gw + "/openresty"
		r.Spec.Nginx.Route = "shared"
	}
	kw := watchKey(t, gw, "openresty", routeKey("shared"))
	createRoute(t, newRoute(a, "m", "m", shared))
	waitCondition(t, a, "m", metav1.ConditionTrue, ReasonReconciled)
	createRoute(t, newRoute(b, "m", "m", shared))
	eventually(t, "the second route's first status", func() (bool, string) {
		c := findCond(getRoute(t, b, "m"), TypeReady)
		return c != nil, fmt.Sprint(c)
	})
	window := raceWindow(t)
	before := kw.snapshot()
	time.Sleep(window) // observation window: every write in it is counted
	after := kw.snapshot()
	t.Logf("writes of %s over %s: %s/m %d, %s/m %d (since start: %v)", routeKey("shared"), window,
		a, after[a+"/m"]-before[a+"/m"], b, after[b+"/m"]-before[b+"/m"], after)
	if after[b+"/m"] != 0 {
		t.Errorf("the loser wrote the key %d times", after[b+"/m"])
	}
	if after[a+"/m"] != before[a+"/m"] {
		t.Errorf("the owner rewrote the key during the window: %d → %d", before[a+"/m"], after[a+"/m"])
	}
	if o := owner(t, gw, "openresty", routeKey("shared")); o != a+"/m" {
		t.Errorf("key owned by %s", o)
	}
	if n := warningEvents(t, b, "m", ReasonOutputConflict); n != 1 {
		t.Errorf("%d OutputConflict Warning events, want 1", n)
	}
	loser := waitCondition(t, b, "m", metav1.ConditionFalse, ReasonOutputConflict)
	if c := findCond(loser, TypeReady); !strings.Contains(c.Message, "ModelRoute "+a+"/m") {
		t.Errorf("conflict message does not name the owner: %s", c.Message)
	}
	if r := getRoute(t, a, "m"); findCond(r, TypeReady).Status != metav1.ConditionTrue {
		t.Errorf("owner not Ready: %+v", r.Status.Conditions)
	}
	// The owner goes away: the other route takes the key over.
	must(t, k8s.Delete(context.Background(), getRoute(t, a, "m")))
	waitCondition(t, b, "m", metav1.ConditionTrue, ReasonReconciled)
	waitKey(t, gw, "openresty", routeKey("shared"), []string{host("10.31.1.1"), "ModelRoute " + b + "/m;"}, []string{host("10.31.0.1")})
	if v, _ := cmKey(t, gw, "openresty", "nginx.conf"); v != "# the consumer's own\n" {
		t.Errorf("nginx.conf changed: %q", v)
	}
}

// TestMonitorModelsThatShareAKey: monitor models Org/M and Org_M both map
// to Org_M.monitor.conf. The older route keeps it; the other reports
// OutputConflict and still writes its own route file.
func TestMonitorModelsThatShareAKey(t *testing.T) {
	ns := namespace(t, "monkey")
	startManager(t)
	configMap(t, ns, "routes", map[string]string{}, nil)
	configMap(t, ns, "monitor", map[string]string{}, nil)
	service(t, ns, "m", 8000)
	endpointSlice(t, ns, "m-1", "m", v4, 8000, up("10.32.0.1"))
	mon := func(model string) func(*v1alpha1.ModelRoute) {
		return func(r *v1alpha1.ModelRoute) {
			r.Spec.Monitor = &v1alpha1.Monitor{OutputConfigMap: "monitor", Model: model}
		}
	}
	createRoute(t, newRoute(ns, "first", "m", mon("Org/M")))
	waitCondition(t, ns, "first", metav1.ConditionTrue, ReasonReconciled)
	createRoute(t, newRoute(ns, "second", "m", mon("Org_M")))
	r := waitCondition(t, ns, "second", metav1.ConditionFalse, ReasonOutputConflict)
	if c := findCond(r, TypeReady); !strings.Contains(c.Message, "Org_M.monitor.conf") || !strings.Contains(c.Message, ns+"/first") || !strings.Contains(c.Message, "spec.monitor.model") {
		t.Errorf("message: %s", c.Message)
	}
	waitKey(t, ns, "routes", routeKey("second"), []string{host("10.32.0.1")}, nil)
	if v, _ := cmKey(t, ns, "monitor", "Org_M.monitor.conf"); !strings.Contains(v, "model=Org/M ") {
		t.Errorf("monitor key overwritten: %q", v)
	}
	if got := getRoute(t, ns, "second").Status.Outputs; len(got) != 1 || got[0].ConfigMap != ns+"/routes" {
		t.Errorf("status.outputs lists a key the route does not hold: %+v", got)
	}
}

// TestTwoRoutesOneCartConfigMap: two routes name one CART ConfigMap. The
// older one fills workers (with its mark); the other writes nothing there.
// The CART file is not removed on deletion, so the hand-over comes from
// the route watch: the other route's backends replace the workers.
func TestTwoRoutesOneCartConfigMap(t *testing.T) {
	ns := namespace(t, "cartshare")
	startManager(t)
	configMap(t, ns, "routes", map[string]string{}, nil)
	configMap(t, ns, "cart", map[string]string{compiler.CartKey: "server:\n  port: 9000\nworkers: []\n"}, nil)
	service(t, ns, "cart", 9000)
	for i, name := range []string{"a", "b"} {
		service(t, ns, name, 8000)
		endpointSlice(t, ns, name+"-1", name, v4, 8000, up(fmt.Sprintf("10.33.%d.1", i)))
	}
	withCart := func(r *v1alpha1.ModelRoute) {
		r.Spec.Cart = &v1alpha1.Cart{Discovery: v1alpha1.Discovery{Service: "cart"}, OutputConfigMap: "cart"}
	}
	createRoute(t, newRoute(ns, "a", "a", withCart))
	waitCondition(t, ns, "a", metav1.ConditionTrue, ReasonReconciled)
	createRoute(t, newRoute(ns, "b", "b", withCart))
	waitCondition(t, ns, "b", metav1.ConditionFalse, ReasonOutputConflict)
	v, _ := cmKey(t, ns, "cart", compiler.CartKey)
	if c := compiler.ReadContent(compiler.CartKey, []byte(v)); c.Owner != ns+"/a" || len(c.Workers) != 1 || c.Workers[0] != "http://10.33.0.1:8000" {
		t.Errorf("CART config: %+v\n%s", c, v)
	}
	must(t, k8s.Delete(context.Background(), getRoute(t, ns, "a")))
	waitCondition(t, ns, "b", metav1.ConditionTrue, ReasonReconciled)
	waitKey(t, ns, "cart", compiler.CartKey, []string{"http://10.33.1.1:8000", "ModelRoute " + ns + "/b;", "port: 9000"}, []string{"10.33.0.1"})
}

// TestHandWrittenKeySurvives: a key written by hand is never overwritten
// or removed by a route that renders the same name (create, update,
// delete), nor is another application's config.yaml given workers; with
// the adopt-foreign-keys annotation a route takes the file over.
func TestHandWrittenKeySurvives(t *testing.T) {
	ns := namespace(t, "hand")
	startManager(t)
	const legacy = "# maintained by the platform team\nserver { listen unix:/tmp/legacy.sock; }\n"
	const appConfig = "log_level: debug\nlisten: 8080\n"
	configMap(t, ns, "routes", map[string]string{routeKey("legacy"): legacy}, nil)
	configMap(t, ns, "app", map[string]string{compiler.CartKey: appConfig}, nil)
	service(t, ns, "m", 8000)
	service(t, ns, "cart", 9000)
	endpointSlice(t, ns, "m-1", "m", v4, 8000, up("10.34.0.1"))
	createRoute(t, newRoute(ns, "legacy", "m", func(r *v1alpha1.ModelRoute) {
		r.Spec.Cart = &v1alpha1.Cart{Discovery: v1alpha1.Discovery{Service: "cart"}, OutputConfigMap: "app"}
	}))
	r := waitCondition(t, ns, "legacy", metav1.ConditionFalse, ReasonOutputKeyForeign)
	msg := findCond(r, TypeReady).Message
	for _, want := range []string{routeKey("legacy"), AdoptForeignKeysAnnotation, ns + "/app"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q: %s", want, msg)
		}
	}
	check := func(when string) {
		t.Helper()
		if v, _ := cmKey(t, ns, "routes", routeKey("legacy")); v != legacy {
			t.Errorf("%s: hand-written key changed: %q", when, v)
		}
		if v, _ := cmKey(t, ns, "app", compiler.CartKey); v != appConfig {
			t.Errorf("%s: another application's config.yaml changed: %q", when, v)
		}
	}
	check("create")
	updateRoute(t, ns, "legacy", func(r *v1alpha1.ModelRoute) { r.Spec.Nginx.Values = map[string]string{"default_max": "7"} })
	waitCondition(t, ns, "legacy", metav1.ConditionFalse, ReasonOutputKeyForeign)
	check("update")
	must(t, k8s.Delete(context.Background(), getRoute(t, ns, "legacy")))
	eventually(t, "route gone", func() (bool, string) {
		err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "legacy"}, &v1alpha1.ModelRoute{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	check("delete")

	// Migration: the annotation takes the hand-written file over.
	createRoute(t, newRoute(ns, "legacy", "m", func(r *v1alpha1.ModelRoute) {
		r.Annotations = map[string]string{AdoptForeignKeysAnnotation: "true"}
	}))
	waitCondition(t, ns, "legacy", metav1.ConditionTrue, ReasonReconciled)
	waitKey(t, ns, "routes", routeKey("legacy"), []string{host("10.34.0.1"), "ModelRoute " + ns + "/legacy;"}, []string{"platform team"})
}

// TestForgedStatusOutputsDeletesNothing: status.outputs is only a hint.
// A forged entry (the consumer's nginx.conf, another route's key) is not
// removed, neither as a stale key after a restart nor on deletion.
func TestForgedStatusOutputsDeletesNothing(t *testing.T) {
	ns := namespace(t, "forged")
	h := newHarness(t)
	configMap(t, ns, "routes", map[string]string{"nginx.conf": "events {}\n"}, nil)
	service(t, ns, "m", 8000)
	endpointSlice(t, ns, "m-1", "m", v4, 8000, up("10.35.0.1"))
	createRoute(t, newRoute(ns, "victim", "m"))
	createRoute(t, newRoute(ns, "forger", "m"))
	waitCondition(t, ns, "victim", metav1.ConditionTrue, ReasonReconciled)
	waitCondition(t, ns, "forger", metav1.ConditionTrue, ReasonReconciled)
	h.stop()

	forge := func() {
		r := getRoute(t, ns, "forger")
		r.Status.Outputs = []v1alpha1.OutputKeys{{ConfigMap: ns + "/routes", Keys: []string{"nginx.conf", routeKey("forger"), routeKey("victim")}}}
		must(t, k8s.Status().Update(context.Background(), r))
	}
	forge()
	// Restart, and a spec change that makes every other listed key stale.
	h = startManager(t)
	updateRoute(t, ns, "forger", func(r *v1alpha1.ModelRoute) { r.Spec.Nginx.Values = map[string]string{"default_max": "9"} })
	waitCondition(t, ns, "forger", metav1.ConditionTrue, ReasonReconciled)
	intact := func(when string) {
		t.Helper()
		if v, ok := cmKey(t, ns, "routes", "nginx.conf"); !ok || v != "events {}\n" {
			t.Errorf("%s: nginx.conf removed or changed: %q", when, v)
		}
		if v, ok := cmKey(t, ns, "routes", routeKey("victim")); !ok || !strings.Contains(v, "ModelRoute "+ns+"/victim;") {
			t.Errorf("%s: the other route's key removed or changed", when)
		}
	}
	intact("stale removal after restart")

	h.stop()
	forge()
	h = startManager(t)
	must(t, k8s.Delete(context.Background(), getRoute(t, ns, "forger")))
	eventually(t, "forger gone", func() (bool, string) {
		err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "forger"}, &v1alpha1.ModelRoute{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	intact("delete")
	if _, ok := cmKey(t, ns, "routes", routeKey("forger")); ok {
		t.Error("the route's own key was not removed")
	}
	_ = h
}
