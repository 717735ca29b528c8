package scaler

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/internal/testenv"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func spec(idle string) *routespec.ScaleToZero {
	return &routespec.ScaleToZero{Target: routespec.ScaleTarget{Kind: "Deployment", Name: "qwen"}, WakeReplicas: 2, HoldTimeout: "300s", IdleAfter: idle}
}

func TestDecide(t *testing.T) {
	g := 10 * time.Second
	for _, c := range []struct {
		name string
		in   Input
		want Decision
	}{
		{"no spec", Input{Replicas: 0, Demand: Demand{Waiting: 3}}, Decision{}},
		{"zero, nobody waits", Input{Spec: spec(""), Replicas: 0}, Decision{}},
		{"zero, requests wait: wake to wakeReplicas", Input{Spec: spec(""), Replicas: 0, Demand: Demand{Waiting: 3}}, Decision{Scale: true, Replicas: 2}},
		{"zero, requests wait, an HPA too: still woken", Input{Spec: spec("60s"), Replicas: 0, Demand: Demand{Waiting: 1}, Autoscalers: []string{"HorizontalPodAutoscaler/qwen"}}, Decision{Scale: true, Replicas: 2}},
		{"awake, no idleAfter: never scaled down", Input{Spec: spec(""), Replicas: 2, Demand: Demand{Last: t0}, Now: t0.Add(48 * time.Hour), Granularity: g}, Decision{}},
		{"awake, idle not yet over: decide again at the deadline", Input{Spec: spec("60s"), Replicas: 2, Demand: Demand{Last: t0}, Now: t0.Add(30 * time.Second), Granularity: g}, Decision{After: 40 * time.Second}},
		{"awake, idleAfter passed but not the granularity: not before", Input{Spec: spec("60s"), Replicas: 2, Demand: Demand{Last: t0}, Now: t0.Add(65 * time.Second), Granularity: g}, Decision{After: 5 * time.Second}},
		{"awake, idle over: scaled to 0", Input{Spec: spec("60s"), Replicas: 2, Demand: Demand{Last: t0}, Now: t0.Add(70 * time.Second), Granularity: g}, Decision{Scale: true, Replicas: 0}},
		{"awake, idle over but requests wait", Input{Spec: spec("60s"), Replicas: 2, Demand: Demand{Last: t0, Waiting: 1}, Now: t0.Add(time.Hour), Granularity: g}, Decision{KeptUp: "1 request(s) open"}},
		{"just woken: idle counts from the wake", Input{Spec: spec("60s"), Replicas: 2, Demand: Demand{Last: t0}, Awake: t0.Add(time.Hour), Now: t0.Add(time.Hour + 30*time.Second), Granularity: g}, Decision{After: 40 * time.Second}},
		{"no request ever, never woken: left alone", Input{Spec: spec("60s"), Replicas: 2, Now: t0, Granularity: g}, Decision{}},
		{"another autoscaler: idleAfter refused", Input{Spec: spec("60s"), Replicas: 2, Demand: Demand{Last: t0}, Now: t0.Add(time.Hour), Autoscalers: []string{"ScaledObject/qwen"}, Granularity: g}, Decision{IdleRefused: []string{"ScaledObject/qwen"}}},
		{"the reports' own step", Input{Spec: spec("60s"), Replicas: 2, Demand: Demand{Last: t0, StepSeconds: 1}, Now: t0.Add(61 * time.Second), Granularity: g}, Decision{Scale: true, Replicas: 0}},
		{"awake, idle over but a stream is open: kept up", Input{Spec: spec("60s"), Replicas: 2, Demand: Demand{Last: t0, Open: 1}, Now: t0.Add(time.Hour), Granularity: g}, Decision{KeptUp: "1 request(s) open"}},
		{"awake, idle over but a consumer's report stopped: kept up, decided again in a step", Input{Spec: spec("60s"), Replicas: 2, Demand: Demand{Last: t0, Stale: []string{"llm/openresty-0"}}, Now: t0.Add(time.Hour), Granularity: g}, Decision{After: g, KeptUp: "stale"}},
		{"the stream ended: idle counts from its end", Input{Spec: spec("60s"), Replicas: 2, Demand: Demand{Last: t0.Add(50 * time.Minute)}, Awake: t0, Now: t0.Add(50*time.Minute + 30*time.Second), Granularity: g}, Decision{After: 40 * time.Second}},
		{"zero, requests wait only on pods that do not serve the route: not woken", Input{Spec: spec(""), Replicas: 0, Demand: Demand{Ignored: 5, Open: 5}}, Decision{}},
		{"zero, wakeReplicas above the schema's bound: bounded", Input{Spec: &routespec.ScaleToZero{Target: routespec.ScaleTarget{Kind: "Deployment", Name: "qwen"}, WakeReplicas: 5000}, Replicas: 0, Demand: Demand{Waiting: 1}}, Decision{Scale: true, Replicas: routespec.MaxWakeReplicas}},
		{"minutes", Input{Spec: spec("2m"), Replicas: 1, Demand: Demand{Last: t0}, Now: t0.Add(2*time.Minute + 9*time.Second), Granularity: g}, Decision{After: time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Decide(c.in)
			got.Why = ""
			if got.Scale != c.want.Scale || got.Replicas != c.want.Replicas || got.After != c.want.After || !slices.Equal(got.IdleRefused, c.want.IdleRefused) ||
				(got.KeptUp == "") != (c.want.KeptUp == "") || (c.want.KeptUp == "1 request(s) open" && got.KeptUp != c.want.KeptUp) {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestAggregate(t *testing.T) {
	now := t0.Add(2 * time.Minute)
	reports := []Report{
		{Pod: "llm/a", Serving: true, Report: served.Report{DemandAt: now, Demand: map[string]served.Demand{"qwen": {Waiting: 2, Open: 3, Last: t0}, "other": {Waiting: 9, Last: t0.Add(time.Hour)}}}},
		{Pod: "llm/b", Serving: true, Report: served.Report{Demand: map[string]served.Demand{"qwen": {Waiting: 1, Open: 1, Last: t0.Add(time.Minute), StepSeconds: 2}}}},
		// Does not serve the route's current output: its held requests
		// wake nothing, but they are open (kept up); its DemandAt is old.
		{Pod: "llm/c", Report: served.Report{DemandAt: now.Add(-served.DemandStaleSteps*2*time.Second - time.Second), Demand: map[string]served.Demand{"qwen": {Waiting: 4, Last: t0, StepSeconds: 2}}}},
		{Pod: "llm/d", Serving: true},
	}
	got := Aggregate(reports, "qwen", now)
	want := Demand{Waiting: 3, Ignored: 4, Open: 8, Last: t0.Add(time.Minute), StepSeconds: 2, Stale: []string{"llm/c"}}
	if got.Waiting != want.Waiting || got.Ignored != want.Ignored || got.Open != want.Open || !got.Last.Equal(want.Last) || got.StepSeconds != want.StepSeconds || !slices.Equal(got.Stale, want.Stale) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got := Aggregate(reports[:2], "none", now); got.Waiting != 0 || got.Open != 0 || !got.Last.IsZero() || len(got.Stale) != 0 {
		t.Errorf("a route no report names: %+v", got)
	}
}

func TestBacks(t *testing.T) {
	pods := map[string]string{"app": "qwen", "team": "llm"}
	for _, c := range []struct {
		sel  string
		want string // "" = backs; else a part of the reason
	}{
		{"app=qwen", ""},
		{"app=qwen,team=llm", ""},
		{"app in (qwen,wan)", ""},
		{"app=billing", "not selected by"},
		{"app=qwen,tier=gpu", "not selected by"},
		{"", "has no pod selector"},
	} {
		sel, err := labels.Parse(c.sel)
		if err != nil {
			t.Fatal(err)
		}
		got := Backs(pods, sel, "Service llm/qwen")
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("selector %q: %q, want %q", c.sel, got, c.want)
		}
	}
	if got := Backs(pods, nil, "Service llm/qwen"); !strings.Contains(got, "has no pod selector") {
		t.Errorf("no selector: %q", got)
	}
}

func TestNamespace(t *testing.T) {
	for _, c := range []struct {
		svc, sel, ns, want string
	}{{"llm/qwen", "", "routes", "llm"}, {"qwen", "", "routes", "routes"}, {"", "app=qwen", "routes", "routes"}, {"", "app=qwen", "", "default"}} {
		s := &routespec.Spec{Discovery: routespec.Discovery{Service: c.svc, Selector: c.sel}}
		if got := Namespace(s, c.ns); got != c.want {
			t.Errorf("%+v: %s, want %s", c, got, c.want)
		}
	}
}

// TestScalerOnAPIServer: the scale subresource of a real Deployment and
// StatefulSet is read and set, and the HPAs and KEDA ScaledObjects that
// target a workload are found (a cluster without KEDA is no error).
func TestScalerOnAPIServer(t *testing.T) {
	_, cfg := testenv.Start(t)
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := apiextv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := "models"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "qwen"}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "m", Image: "vllm"}}}}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen"}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}}
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "wan"}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}}
	for _, o := range []client.Object{dep, sts} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	s := &Scaler{Client: c, Reader: c}
	qwen := routespec.ScaleTarget{Kind: "Deployment", Name: "qwen"}
	wan := routespec.ScaleTarget{Kind: "StatefulSet", Name: "wan"}
	if n, err := s.Replicas(ctx, ns, qwen); err != nil || n != 0 {
		t.Fatalf("deployment replicas %d, %v; want 0", n, err)
	}
	if n, err := s.Replicas(ctx, ns, wan); err != nil || n != 3 {
		t.Fatalf("statefulset replicas %d, %v; want 3", n, err)
	}
	if err := s.SetReplicas(ctx, ns, qwen, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.SetReplicas(ctx, ns, wan, 0); err != nil {
		t.Fatal(err)
	}
	var gotDep appsv1.Deployment
	var gotSts appsv1.StatefulSet
	if err := c.Get(ctx, client.ObjectKeyFromObject(dep), &gotDep); err != nil || *gotDep.Spec.Replicas != 2 {
		t.Errorf("deployment spec.replicas after the scale patch: %v, %v", gotDep.Spec.Replicas, err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(sts), &gotSts); err != nil || *gotSts.Spec.Replicas != 0 {
		t.Errorf("statefulset spec.replicas after the scale patch: %v, %v", gotSts.Spec.Replicas, err)
	}
	if _, err := s.Replicas(ctx, ns, routespec.ScaleTarget{Kind: "Deployment", Name: "missing"}); err == nil {
		t.Error("a missing target read without error")
	}

	// No autoscaler, and no KEDA installed: none, no error.
	if got, err := s.Autoscalers(ctx, ns, qwen); err != nil || len(got) != 0 {
		t.Fatalf("autoscalers %v, %v; want none", got, err)
	}
	hpa := &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen-hpa"}, Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
		ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "qwen"}, MinReplicas: ptr.To[int32](1), MaxReplicas: 4,
	}}
	other := hpa.DeepCopy()
	other.Name, other.Spec.ScaleTargetRef.Name = "other-hpa", "other"
	for _, o := range []client.Object{hpa, other} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	installScaledObjectCRD(ctx, t, c)
	for _, so := range []struct{ name, kind, target string }{{"qwen-keda", "", "qwen"}, {"wan-keda", "StatefulSet", "wan"}, {"wan-as-deployment", "", "wan"}} {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("keda.sh/v1alpha1")
		u.SetKind("ScaledObject")
		u.SetNamespace(ns)
		u.SetName(so.name)
		ref := map[string]any{"name": so.target}
		if so.kind != "" {
			ref["kind"] = so.kind
		}
		u.Object["spec"] = map[string]any{"scaleTargetRef": ref}
		if err := c.Create(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.Autoscalers(ctx, ns, qwen); err != nil || !slices.Equal(got, []string{"HorizontalPodAutoscaler/qwen-hpa", "ScaledObject/qwen-keda"}) {
		t.Errorf("qwen's autoscalers %v, %v", got, err)
	}
	if got, err := s.Autoscalers(ctx, ns, wan); err != nil || !slices.Equal(got, []string{"ScaledObject/wan-keda"}) {
		t.Errorf("wan's autoscalers %v, %v", got, err)
	}
}

func installScaledObjectCRD(ctx context.Context, t *testing.T, c client.Client) {
	t.Helper()
	crd := &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "scaledobjects.keda.sh"},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: "keda.sh",
			Names: apiextv1.CustomResourceDefinitionNames{Plural: "scaledobjects", Singular: "scaledobject", Kind: "ScaledObject", ListKind: "ScaledObjectList"},
			Scope: apiextv1.NamespaceScoped,
			Versions: []apiextv1.CustomResourceDefinitionVersion{{Name: "v1alpha1", Served: true, Storage: true, Schema: &apiextv1.CustomResourceValidation{
				OpenAPIV3Schema: &apiextv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr.To(true)},
			}}},
		},
	}
	if err := c.Create(ctx, crd); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var got apiextv1.CustomResourceDefinition
		if err := c.Get(ctx, types.NamespacedName{Name: crd.Name}, &got); err == nil {
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextv1.Established && cond.Status == apiextv1.ConditionTrue {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the ScaledObject CRD was not Established in 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
