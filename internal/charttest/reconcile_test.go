package charttest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"github.com/modelsphere/autoconfig/internal/controller"
	"github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TestReconcileAsServiceAccount runs the real reconciler with leader
// election, authenticated as the chart's ServiceAccount (impersonation),
// scoped to watchNamespaces, through a whole scenario (create, scale out,
// update, a FailOpen route's owned fallback Service, delete): if the chart's RBAC lacked a verb the
// controller needs (list a cached kind, patch status, update the
// finalizer, patch the ConfigMap, the Lease), the route would never become
// Ready with its output written.
func TestReconcileAsServiceAccount(t *testing.T) {
	const (
		release  = "rbac"
		ns       = "ac-rbac"
		routes   = "routes-rbac"
		backends = "backends-rbac"
	)
	// The whole scenario shares one deadline; under -race on a loaded
	// machine it takes over 2 minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rel := render(t, release, ns, map[string]any{
		"watchNamespaces":   []any{routes, backends},
		"trustedNamespaces": []any{routes}, // the central route namespace reads the backends namespace
		"failOpen":          map[string]any{"fallbackServiceNamespaces": []any{routes}},
	})
	for _, n := range []string{ns, routes, backends} {
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range rel.Objects {
		if err := k8s.Create(ctx, o.DeepCopy()); err != nil {
			t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}

	createConsumerAndBackend(ctx, t, routes, backends, "10.1.0.7")
	sch := routeScheme(t)
	admin := admin(t)
	cfg := rest.CopyConfig(testCfg)
	sa := release + "-autoconfig"
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + sa,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  sch,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		Cache:                   controller.CacheOptions([]string{routes, backends}),
		LeaderElection:          true,
		LeaderElectionID:        "autoconfig-rbac-test",
		LeaderElectionNamespace: ns,
	})
	must(t, err)
	v, err := schema.Default()
	must(t, err)
	// The flags the chart passes: --trusted-namespace from trustedNamespaces.
	var trusted []string
	for _, a := range strs(container(t, rel.Find("Deployment", ns, release+"-autoconfig"))["args"]) {
		if v, ok := strings.CutPrefix(a, "--trusted-namespace="); ok {
			trusted = strings.Split(v, ",")
		}
	}
	if len(trusted) != 1 || trusted[0] != routes {
		t.Fatalf("chart passes --trusted-namespace %v, want [%s]", trusted, routes)
	}
	r := &controller.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Validator: v, Recorder: mgr.GetEventRecorder(controller.Name), TrustedNamespaces: trusted}
	mctx, stop := context.WithCancel(ctx)
	must(t, r.SetupWithManager(mctx, mgr, 2))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()

	route := &v1alpha1.ModelRoute{}
	must(t, yaml.Unmarshal([]byte(`
apiVersion: routing.modelsphere.dev/v1alpha1
kind: ModelRoute
metadata: {name: wan, namespace: `+routes+`}
spec:
  modelType: video
  discovery: {service: `+backends+`/wan}
  nginx:
    outputConfigMap: openresty-conf
    peers:
    - {use: backend, priority: 2}
    - {use: backend-svc, priority: 1}
`), route))
	must(t, admin.Create(ctx, route))

	var last string
	for {
		got := &v1alpha1.ModelRoute{}
		must(t, admin.Get(ctx, client.ObjectKeyFromObject(route), got))
		cm := &corev1.ConfigMap{}
		must(t, k8s.Get(ctx, client.ObjectKey{Namespace: routes, Name: "openresty-conf"}, cm))
		c := meta.FindStatusCondition(got.Status.Conditions, "Ready")
		if c != nil {
			last = c.Reason + ": " + c.Message
			if strings.Contains(c.Message, "forbidden") {
				t.Fatalf("the chart's RBAC is too narrow for the controller: %s", last)
			}
		}
		if c != nil && c.Status == metav1.ConditionTrue && strings.Contains(cm.Data["session_route_wan.conf"], "server 10.1.0.7:8000 ") {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("manager stopped (RBAC too narrow for the cache or the Lease?): %v", err)
		case <-ctx.Done():
			t.Fatalf("route not Ready with its output written as %s; last Ready condition: %s", sa, last)
		case <-time.After(100 * time.Millisecond):
		}
	}

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case err := <-done:
				t.Fatalf("manager stopped while waiting for %s: %v", what, err)
			case <-ctx.Done():
				t.Fatalf("as %s: timed out waiting for %s", sa, what)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	routeConf := func(key string) string {
		cm := &corev1.ConfigMap{}
		must(t, k8s.Get(ctx, client.ObjectKey{Namespace: routes, Name: "openresty-conf"}, cm))
		return cm.Data[key]
	}

	// Scale out: a second backend appears in the EndpointSlice.
	slice := &discoveryv1.EndpointSlice{}
	must(t, admin.Get(ctx, client.ObjectKey{Namespace: backends, Name: "wan-1"}, slice))
	slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.1.0.8"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	must(t, admin.Update(ctx, slice))
	waitFor("the scaled-out backend in the route file", func() bool {
		return strings.Contains(routeConf("session_route_wan.conf"), "server 10.1.0.8:8000 ")
	})

	// Update the route: a new option is rendered. The controller writes
	// the route's status concurrently, so the update retries on conflict.
	must(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(route), route); err != nil {
			return err
		}
		route.Spec.Nginx.Values = map[string]string{"max_body_size": "128m"}
		return admin.Update(ctx, route)
	}))
	waitFor("the updated route rendered", func() bool {
		return strings.Contains(routeConf("session_route_wan.conf"), "client_max_body_size 128m;")
	})

	// A FailOpen route discovered by selector: the controller creates (and
	// on deletion removes) its owned fallback Service, as the ServiceAccount.
	// Selector discovery reads pods in the route's namespace; the test
	// plays kubelet and sets the pod's status.
	readySelPod(ctx, t, routes)
	sel := &v1alpha1.ModelRoute{}
	must(t, yaml.Unmarshal([]byte(`
apiVersion: routing.modelsphere.dev/v1alpha1
kind: ModelRoute
metadata: {name: sel, namespace: `+routes+`}
spec:
  modelType: video
  failureMode: FailOpen
  discovery: {selector: app=sel}
  nginx:
    outputConfigMap: openresty-conf
    peers:
    - {use: backend, priority: 2}
`), sel))
	must(t, admin.Create(ctx, sel))
	fallback := client.ObjectKey{Namespace: routes, Name: controller.FallbackServiceName("sel")}
	waitFor("the owned fallback Service and the route file", func() bool {
		svc := &corev1.Service{}
		if err := k8s.Get(ctx, fallback, svc); err != nil {
			got := &v1alpha1.ModelRoute{}
			must(t, admin.Get(ctx, client.ObjectKeyFromObject(sel), got))
			for _, c := range got.Status.Conditions {
				if strings.Contains(c.Message, "forbidden") {
					t.Fatalf("the chart's RBAC is too narrow for fallback Services: %s %s: %s", c.Type, c.Reason, c.Message)
				}
			}
			return false
		}
		return svc.Spec.Selector["app"] == "sel" && strings.Contains(routeConf("session_route_sel.conf"), "server 10.1.0.9:8000 ")
	})
	// The same route in a namespace not in failOpen.fallbackServiceNamespaces
	// (backends): the controller cannot be made to create a Service there;
	// the route says so and renders without the VIP tier.
	must(t, k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: backends, Name: "openresty-conf"}}))
	readySelPod(ctx, t, backends)
	outside := sel.DeepCopy()
	outside.ObjectMeta = metav1.ObjectMeta{Name: "sel", Namespace: backends}
	must(t, admin.Create(ctx, outside))
	waitFor("the outside route to report that it may not write Services", func() bool {
		got := &v1alpha1.ModelRoute{}
		must(t, admin.Get(ctx, client.ObjectKeyFromObject(outside), got))
		c := meta.FindStatusCondition(got.Status.Conditions, controller.TypeFallbackServiceConflict)
		return c != nil && c.Reason == controller.ReasonServiceNotPermitted
	})
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: backends, Name: controller.FallbackServiceName("sel")}, &corev1.Service{}); !apierrors.IsNotFound(err) {
		t.Errorf("a fallback Service was created outside failOpen.fallbackServiceNamespaces: %v", err)
	}
	must(t, admin.Delete(ctx, outside))

	must(t, admin.Delete(ctx, sel))
	waitFor("the fallback Service and the route's key removed", func() bool {
		err := k8s.Get(ctx, fallback, &corev1.Service{})
		return client.IgnoreNotFound(err) == nil && err != nil && routeConf("session_route_sel.conf") == ""
	})

	// Scale to zero as the ServiceAccount: a route at zero is written;
	// the consumer pod's served report says requests wait, so the
	// controller wakes the Deployment through its scale subresource; an
	// HPA on it (read with the chart's rights) refuses idleAfter.
	zeroLabels := map[string]string{"app": "zero"}
	must(t, admin.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: backends, Name: "zero"},
		Spec: corev1.ServiceSpec{Selector: zeroLabels, Ports: []corev1.ServicePort{{Name: "http", Port: 8000, TargetPort: intstr.FromInt32(8000)}}}}))
	must(t, admin.Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: backends, Name: "zero"}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To[int32](0), Selector: &metav1.LabelSelector{MatchLabels: zeroLabels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: zeroLabels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}}},
	}}))
	consumerLabels := map[string]string{"app": "openresty"}
	must(t, admin.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: routes, Name: "openresty"},
		Spec: corev1.ServiceSpec{Selector: consumerLabels, Ports: []corev1.ServicePort{{Name: "http", Port: 8080, TargetPort: intstr.FromInt32(8080)}}}}))
	// The served report comes from the pod's own sidecar, with a token
	// bound to the pod, as the chart's admission policy requires (the
	// policies of every release installed in this API server judge it).
	sidecarAccount(ctx, t, routes, "openresty")
	consumer := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: routes, Name: "openresty-0", Labels: consumerLabels},
		Spec: corev1.PodSpec{ServiceAccountName: "openresty", Containers: []corev1.Container{{Name: "openresty", Image: "openresty"}}}}
	must(t, admin.Create(ctx, consumer))
	cport, cname := int32(8080), "http"
	must(t, admin.Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: routes, Name: "openresty-1", Labels: map[string]string{discoveryv1.LabelServiceName: "openresty"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.2.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: routes, Name: "openresty-0"}}},
		Ports: []discoveryv1.EndpointPort{{Name: &cname, Port: &cport}},
	}))
	zero := &v1alpha1.ModelRoute{}
	must(t, yaml.Unmarshal([]byte(`
apiVersion: routing.modelsphere.dev/v1alpha1
kind: ModelRoute
metadata: {name: zero, namespace: `+routes+`}
spec:
  discovery: {service: `+backends+`/zero}
  nginx:
    outputConfigMap: openresty-conf
    service: openresty
    peers:
    - {use: backend, priority: 2}
  scaleToZero:
    target: {kind: Deployment, name: zero}
    idleAfter: 10m
`), zero))
	must(t, admin.Create(ctx, zero))
	zeroCondition := func(typ string) *metav1.Condition {
		got := &v1alpha1.ModelRoute{}
		must(t, admin.Get(ctx, client.ObjectKeyFromObject(zero), got))
		for _, c := range got.Status.Conditions {
			if strings.Contains(c.Message, "forbidden") {
				t.Fatalf("the chart's RBAC is too narrow for scale to zero: %s %s: %s", c.Type, c.Reason, c.Message)
			}
		}
		return meta.FindStatusCondition(got.Status.Conditions, typ)
	}
	// The consumer pod serves the route's file as written and its engine
	// holds requests: only such a report wakes the target.
	waitFor("the route at zero written", func() bool { return routeConf("session_route_zero.conf") != "" })
	demand := served.Report{At: time.Now().UTC(), How: served.HowReload, Keys: map[string]string{"session_route_zero.conf": served.ID([]byte(routeConf("session_route_zero.conf")))},
		Demand: map[string]served.Demand{"zero": {Waiting: 2, Open: 2, Last: time.Now().UTC().Truncate(time.Second)}}}
	value, err := demand.Marshal()
	must(t, err)
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{served.Annotation: value}}})
	must(t, err)
	_, err = asPod(ctx, t, consumer).CoreV1().Pods(routes).Patch(ctx, consumer.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	must(t, err)
	waitFor("the route at zero written and its target woken", func() bool {
		c := zeroCondition("Ready")
		dep := &appsv1.Deployment{}
		must(t, admin.Get(ctx, client.ObjectKey{Namespace: backends, Name: "zero"}, dep))
		return c != nil && c.Reason == "ScaledToZero" && routeConf("session_route_zero.conf") != "" && *dep.Spec.Replicas == 1
	})
	must(t, admin.Create(ctx, &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: backends, Name: "zero"}, Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
		ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "zero"}, MinReplicas: ptr.To[int32](1), MaxReplicas: 2,
	}}))
	// The controller reads the autoscalers at every reconcile of the
	// route (and always before it scales to 0); it does not watch them:
	// a spec change brings the next reconcile now.
	must(t, admin.Patch(ctx, &v1alpha1.ModelRoute{ObjectMeta: metav1.ObjectMeta{Namespace: routes, Name: "zero"}},
		client.RawPatch(types.MergePatchType, []byte(`{"spec":{"scaleToZero":{"idleAfter":"11m"}}}`))))
	waitFor("idleAfter refused beside the HPA", func() bool {
		c := zeroCondition(controller.TypeScaleToZero)
		return c != nil && c.Reason == controller.ReasonIdleAfterRefused && strings.Contains(c.Message, "HorizontalPodAutoscaler/zero")
	})
	must(t, admin.Delete(ctx, zero))
	waitFor("the zero route's key removed", func() bool { return routeConf("session_route_zero.conf") == "" })

	// Deleting the route runs the finalizer as the ServiceAccount too.
	must(t, admin.Delete(ctx, route))
	for {
		err := admin.Get(ctx, client.ObjectKeyFromObject(route), &v1alpha1.ModelRoute{})
		cm := &corev1.ConfigMap{}
		must(t, k8s.Get(ctx, client.ObjectKey{Namespace: routes, Name: "openresty-conf"}, cm))
		if client.IgnoreNotFound(err) == nil && err != nil && len(cm.Data) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("route not removed with its key as %s (get: %v, keys %d)", sa, err, len(cm.Data))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readySelPod creates pod sel-0 (app=sel, port 8000) in ns and sets its
// status as a kubelet would: running, Ready, IP 10.1.0.9.
func readySelPod(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	must(t, k8s.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sel-0", Labels: map[string]string{"app": "sel"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "m", Image: "m",
			Ports: []corev1.ContainerPort{{ContainerPort: 8000}}}}},
	}))
	pod := &corev1.Pod{}
	must(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "sel-0"}, pod))
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.0.9", PodIPs: []corev1.PodIP{{IP: "10.1.0.9"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	must(t, k8s.Status().Update(ctx, pod))
}

// createConsumerAndBackend creates what the consumers' charts and the
// model's Deployment would: the ConfigMap openresty-conf in cmNS, and the
// Service wan (port 8000) in svcNS with one ready endpoint ip.
func createConsumerAndBackend(ctx context.Context, t *testing.T, cmNS, svcNS, ip string) {
	t.Helper()
	must(t, k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: cmNS, Name: "openresty-conf"}}))
	must(t, k8s.Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: svcNS, Name: "wan"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 8000, TargetPort: intstr.FromInt32(8000)}}},
	}))
	ready, port, name := true, int32(8000), "http"
	must(t, k8s.Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: svcNS, Name: "wan-1", Labels: map[string]string{discoveryv1.LabelServiceName: "wan"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
	}))
}
