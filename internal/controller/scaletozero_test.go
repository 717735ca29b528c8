package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// workload creates Deployment name in ns with replicas, its pods labelled
// app=<app>.
func workload(t *testing.T, ns, name, app string, replicas int32) {
	t.Helper()
	l := map[string]string{"app": app}
	must(t, k8s.Create(context.Background(), &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr(replicas), Selector: &metav1.LabelSelector{MatchLabels: l},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: l}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "m", Image: "vllm"}}}},
	}}))
}

// selecting creates Service name in ns selecting pods app=<app>, with
// annotations.
func selecting(t *testing.T, ns, name, app string, annotations map[string]string) {
	t.Helper()
	must(t, k8s.Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": app}, Ports: []corev1.ServicePort{{Name: "http", Port: 8000}}},
	}))
}

func replicasOf(t *testing.T, ns, name string) int32 {
	t.Helper()
	var d appsv1.Deployment
	must(t, k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &d))
	return *d.Spec.Replicas
}

// scaleRoute is an llm route over svc whose scaleToZero target is
// Deployment target, its consumers the pods behind Service openresty.
func scaleRoute(ns, name, svc, target, idleAfter string) *v1alpha1.ModelRoute {
	return newRoute(ns, name, svc, func(r *v1alpha1.ModelRoute) {
		r.Spec.Nginx.Service = "openresty"
		r.Spec.ScaleToZero = &v1alpha1.ScaleToZero{Target: v1alpha1.ScaleTarget{Kind: "Deployment", Name: target}, WakeReplicas: 2, IdleAfter: idleAfter}
	})
}

// reportDemand sets pod's served report: it serves the keys of cm as
// they are now (serving) or content of none of them, and its engine
// holds waiting requests of route.
func reportDemand(t *testing.T, ns, pod, cm, route string, waiting int, serving bool) {
	t.Helper()
	c, err := getCM(t, ns, cm)
	must(t, err)
	keys := map[string]string{}
	for k, v := range c.Data {
		keys[k] = served.ID([]byte(v))
		if !serving {
			keys[k] = served.ID([]byte("something else"))
		}
	}
	now := time.Now().UTC()
	v, err := served.Report{At: now, How: served.HowReload, Keys: keys, DemandAt: now,
		Demand: map[string]served.Demand{route: {Waiting: waiting, Open: waiting, Last: now.Truncate(time.Second), StepSeconds: 1}}}.Marshal()
	must(t, err)
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{served.Annotation: v}}})
	must(t, k8s.Patch(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod}}, client.RawPatch(types.MergePatchType, b)))
}

// waitScaleCondition waits for the route's ScaleToZero condition to be
// status/reason with a message holding every msgHas.
func waitScaleCondition(t *testing.T, ns, name string, status metav1.ConditionStatus, reason string, msgHas ...string) {
	t.Helper()
	eventually(t, ns+"/"+name+" ScaleToZero "+string(status)+"/"+reason, func() (bool, string) {
		c := findCond(getRoute(t, ns, name), TypeScaleToZero)
		if c == nil {
			return false, "no condition"
		}
		ok := c.Status == status && c.Reason == reason
		for _, m := range msgHas {
			ok = ok && strings.Contains(c.Message, m)
		}
		return ok, string(c.Status) + "/" + c.Reason + ": " + c.Message
	})
}

// TestScaleToZeroActsOnlyForTheRoutesOwnWorkload: with the controller
// watching every namespace, a route scales nothing that is not the
// workload behind its own, granted spec.discovery:
//
//   - a route in attacker whose Service victim/web grants nobody
//     (NotPermitted), target db: victim/db keeps its 3 replicas;
//   - a route naming a Service that does not exist (victim/nosuch), target
//     db2: victim/db2 keeps its 3;
//   - in one namespace, route qwen (Service qwen selects app=qwen) with
//     target billing (app=billing): billing keeps its 2, while the route
//     whose target is its own workload (qwen) is scaled to 0 after idle;
//   - a route granted Service victim2/web wakes neither another workload
//     of that namespace (other) on demand, nor its own (web) on demand
//     from a consumer pod that does not serve the route's current output;
//     the same demand from a pod that serves it wakes web to wakeReplicas.
func TestScaleToZeroActsOnlyForTheRoutesOwnWorkload(t *testing.T) {
	attacker, victim, victim2, team := namespace(t, "attacker"), namespace(t, "victim"), namespace(t, "victim2"), namespace(t, "team")
	startManager(t)
	for _, ns := range []string{attacker, team} {
		configMap(t, ns, "routes", map[string]string{}, nil)
	}
	consumerEntry(t, attacker, "openresty", "openresty-0", "openresty-1")

	// Cross namespace without a grant; a Service that does not exist.
	selecting(t, victim, "web", "web", nil)
	workload(t, victim, "db", "db", 3)
	workload(t, victim, "db2", "db2", 3)
	createRoute(t, scaleRoute(attacker, "steal", victim+"/web", "db", "10s"))
	createRoute(t, scaleRoute(attacker, "ghost", victim+"/nosuch", "db2", "10s"))

	// One namespace, another team's workload; and the route's own.
	selecting(t, team, "qwen", "qwen", nil)
	endpointSlice(t, team, "qwen-1", "qwen", v4, 8000, up("10.7.0.1"))
	workload(t, team, "billing", "billing", 2)
	workload(t, team, "qwen", "qwen", 1)
	createRoute(t, scaleRoute(team, "qwen", "qwen", "billing", "10s"))
	createRoute(t, scaleRoute(team, "own", "qwen", "qwen", "10s"))

	// A granted Service: another workload of its namespace, and its own.
	selecting(t, victim2, "web", "web", map[string]string{sink.AllowedNamespacesAnnotation: attacker})
	workload(t, victim2, "other", "other", 0)
	workload(t, victim2, "web", "web", 0)
	createRoute(t, scaleRoute(attacker, "wake-other", victim2+"/web", "other", ""))
	createRoute(t, scaleRoute(attacker, "wake-web", victim2+"/web", "web", ""))

	waitCondition(t, attacker, "steal", metav1.ConditionFalse, ReasonNotPermitted)
	waitScaleCondition(t, attacker, "steal", metav1.ConditionFalse, ReasonScaleBlocked, "Deployment "+victim+"/db", ReasonNotPermitted)
	waitCondition(t, attacker, "ghost", metav1.ConditionFalse, ReasonServiceNotFound)
	waitScaleCondition(t, attacker, "ghost", metav1.ConditionFalse, ReasonScaleBlocked, "Deployment "+victim+"/db2", ReasonServiceNotFound)
	waitScaleCondition(t, team, "qwen", metav1.ConditionFalse, ReasonTargetNotSelected, "Deployment "+team+"/billing", "app=billing", "Service "+team+"/qwen")
	waitScaleCondition(t, team, "own", metav1.ConditionTrue, ReasonAwake)
	waitScaleCondition(t, attacker, "wake-other", metav1.ConditionFalse, ReasonTargetNotSelected, "Deployment "+victim2+"/other")
	waitScaleCondition(t, attacker, "wake-web", metav1.ConditionTrue, ReasonAsleep)

	// Demand: for wake-other from a pod serving it, for wake-web from a
	// pod that does not serve its current output.
	waitKey(t, attacker, "routes", routeKey("wake-other"), nil, nil)
	waitKey(t, attacker, "routes", routeKey("wake-web"), nil, nil)
	reportDemand(t, attacker, "openresty-0", "routes", "wake-other", 5, true)
	reportDemand(t, attacker, "openresty-1", "routes", "wake-web", 5, false)

	// The route's own workload goes to 0 after idleAfter and a step
	// (10 s + the default 10 s without reports): wait past that.
	testbin.WaitUntil(t, 60*time.Second, 50*time.Millisecond, team+"/qwen scaled to 0 by route own", func() string {
		if n := replicasOf(t, team, "qwen"); n != 0 {
			return fmt.Sprintf("replicas %d", n)
		}
		return ""
	})
	for _, c := range []struct {
		ns, name string
		want     int32
	}{{victim, "db", 3}, {victim, "db2", 3}, {team, "billing", 2}, {victim2, "other", 0}, {victim2, "web", 0}} {
		if got := replicasOf(t, c.ns, c.name); got != c.want {
			t.Errorf("Deployment %s/%s has %d replicas, want %d: scaled by a route it is not the workload of", c.ns, c.name, got, c.want)
		}
	}
	waitScaleCondition(t, attacker, "wake-web", metav1.ConditionTrue, ReasonAsleep)

	// The same demand from a pod that serves the route's current output
	// wakes its own workload.
	reportDemand(t, attacker, "openresty-1", "routes", "wake-web", 5, true)
	eventually(t, victim2+"/web woken to wakeReplicas", func() (bool, string) {
		n := replicasOf(t, victim2, "web")
		return n == 2, fmt.Sprintf("replicas %d", n)
	})
	if got := replicasOf(t, victim2, "other"); got != 0 {
		t.Errorf("Deployment %s/other has %d replicas after demand on a route it is not the workload of", victim2, got)
	}
}
