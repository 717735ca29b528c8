package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// agreeCase drives one reason that keeps a route from writing (Ready=False)
// on the real API server.
type agreeCase struct {
	reason string
	// watch is the controller's --namespace (nil = all), given the case's
	// namespaces.
	watch func(ns, other string) []string
	// setup creates the cluster state and the route in ns (other is a
	// second namespace); it returns the route's name and the keys
	// ("ns/cm|key") the reason must hold back ("" for a reason that holds
	// back the whole route).
	setup func(t *testing.T, ns, other string) (route string, keys []string)
	// unknowable says why a preview cannot tell before the controller
	// writes (the API server refuses the write itself); such a case is
	// not driven, and its reason must be listed here with the why.
	unknowable string
}

// agreeCases has one entry per write-blocking reason (precedence).
var agreeCases = []agreeCase{
	{reason: ReasonNamespaceNotWatched,
		watch: func(ns, _ string) []string { return []string{ns} },
		setup: func(t *testing.T, ns, other string) (string, []string) {
			configMap(t, ns, "routes", map[string]string{}, nil)
			createRoute(t, newRoute(ns, "m", other+"/m"))
			return "m", nil
		}},
	{reason: ReasonServiceNotFound,
		setup: func(t *testing.T, ns, _ string) (string, []string) {
			configMap(t, ns, "routes", map[string]string{}, nil)
			createRoute(t, newRoute(ns, "m", "gone"))
			return "m", nil
		}},
	{reason: ReasonPortNotDerivable,
		setup: func(t *testing.T, ns, _ string) (string, []string) {
			configMap(t, ns, "routes", map[string]string{}, nil)
			ctx := context.Background()
			must(t, k8s.Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m"},
				Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
					{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8000)},
					{Name: "grpc", Port: 81, TargetPort: intstr.FromInt32(9000)},
				}},
			}))
			must(t, k8s.Create(ctx, &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: "m-1", Labels: map[string]string{discoveryv1.LabelServiceName: "m"}},
				AddressType: v4,
				Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8000))}, {Name: ptr("grpc"), Port: ptr(int32(9000))}},
				Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.50.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}},
			}))
			createRoute(t, newRoute(ns, "m", "m"))
			return "m", nil
		}},
	{reason: ReasonNoBackends,
		setup: func(t *testing.T, ns, _ string) (string, []string) {
			configMap(t, ns, "routes", map[string]string{}, nil)
			service(t, ns, "m", 8000)
			createRoute(t, newRoute(ns, "m", "m"))
			return "m", nil
		}},
	{reason: ReasonCompileFailed,
		setup: func(t *testing.T, ns, _ string) (string, []string) {
			configMap(t, ns, "routes", map[string]string{}, nil)
			must(t, k8s.Create(context.Background(), &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m"},
				Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone,
					Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8000)}}},
			}))
			endpointSlice(t, ns, "m-1", "m", v4, 8000, up("10.50.0.2"))
			createRoute(t, newRoute(ns, "m", "m", func(r *v1alpha1.ModelRoute) {
				r.Spec.Nginx.Peers = []v1alpha1.Peer{{Use: v1alpha1.UseBackendSvc}} // headless: no tier at all
			}))
			return "m", nil
		}},
	{reason: ReasonMonitorInNginxConfigMap, // another route's nginx ConfigMap (the route's own is InvalidSpec)
		setup: func(t *testing.T, ns, _ string) (string, []string) {
			configMap(t, ns, "routes", map[string]string{}, nil)
			configMap(t, ns, "other", map[string]string{}, nil)
			service(t, ns, "m", 8000)
			endpointSlice(t, ns, "m-1", "m", v4, 8000, up("10.50.0.3"))
			createRoute(t, newRoute(ns, "n", "m", func(r *v1alpha1.ModelRoute) { r.Spec.Nginx.OutputConfigMap = "other" }))
			createRoute(t, newRoute(ns, "m", "m", func(r *v1alpha1.ModelRoute) {
				r.Spec.Monitor = &v1alpha1.Monitor{OutputConfigMap: ns + "/other"}
			}))
			return "m", []string{ns + "/other|m.monitor.conf"}
		}},
	{reason: ReasonOutputConfigMapMissing,
		setup: func(t *testing.T, ns, _ string) (string, []string) {
			service(t, ns, "m", 8000)
			endpointSlice(t, ns, "m-1", "m", v4, 8000, up("10.50.0.4"))
			createRoute(t, newRoute(ns, "m", "m"))
			return "m", []string{ns + "/routes|" + routeKey("m")}
		}},
	{reason: ReasonNotPermitted, // a ConfigMap that grants the route's namespace nothing
		setup: func(t *testing.T, ns, other string) (string, []string) {
			configMap(t, other, "routes", map[string]string{}, nil)
			service(t, ns, "m", 8000)
			endpointSlice(t, ns, "m-1", "m", v4, 8000, up("10.50.0.5"))
			createRoute(t, newRoute(ns, "m", "m", func(r *v1alpha1.ModelRoute) { r.Spec.Nginx.OutputConfigMap = other + "/routes" }))
			return "m", []string{other + "/routes|" + routeKey("m")}
		}},
	{reason: ReasonNotPermitted, // a Service that grants the route's namespace nothing
		setup: func(t *testing.T, ns, other string) (string, []string) {
			configMap(t, ns, "routes", map[string]string{}, nil)
			service(t, other, "m", 8000)
			endpointSlice(t, other, "m-1", "m", v4, 8000, up("10.50.0.6"))
			createRoute(t, newRoute(ns, "m", other+"/m"))
			return "m", nil
		}},
	{reason: ReasonOutputForbidden,
		unknowable: "the controller's own RBAC refuses the patch; a preview runs with the reader's identity and writes nothing, so it cannot ask (TestOutputForbidden drives the reason)"},
	{reason: ReasonOutputConflict, // a key already owned by an older route
		setup: func(t *testing.T, ns, other string) (string, []string) {
			configMap(t, ns, "routes", map[string]string{}, map[string]string{sink.AllowedNamespacesAnnotation: other})
			for _, n := range []string{ns, other} {
				service(t, n, "m", 8000)
				endpointSlice(t, n, "m-1", "m", v4, 8000, up("10.50.0.7"))
			}
			createRoute(t, newRoute(ns, "m", "m"))
			waitCondition(t, ns, "m", metav1.ConditionTrue, ReasonReconciled)
			createRoute(t, newRoute(other, "m", "m", func(r *v1alpha1.ModelRoute) { r.Spec.Nginx.OutputConfigMap = ns + "/routes" }))
			return "m@" + other, []string{ns + "/routes|" + routeKey("m")}
		}},
	{reason: ReasonOutputKeyForeign, // a hand-written key
		setup: func(t *testing.T, ns, _ string) (string, []string) {
			configMap(t, ns, "routes", map[string]string{routeKey("m"): "# by hand\n"}, nil)
			service(t, ns, "m", 8000)
			endpointSlice(t, ns, "m-1", "m", v4, 8000, up("10.50.0.8"))
			createRoute(t, newRoute(ns, "m", "m"))
			return "m", []string{ns + "/routes|" + routeKey("m")}
		}},
	{reason: ReasonOutputTooLarge,
		setup: func(t *testing.T, ns, _ string) (string, []string) {
			configMap(t, ns, "routes", map[string]string{"big.txt": strings.Repeat("x", sink.MaxSize-200)}, nil)
			service(t, ns, "m", 8000)
			endpointSlice(t, ns, "m-1", "m", v4, 8000, up("10.50.0.9"))
			createRoute(t, newRoute(ns, "m", "m"))
			return "m", []string{ns + "/routes|" + routeKey("m")}
		}},
	{reason: ReasonOutputRejected,
		unknowable: "the API server's validation of the patched ConfigMap refuses it; only the write itself can tell, and a preview writes nothing (internal/sink's TestInvalidWriteIsNotRetriedAsAFailedTest drives the state)"},
	{reason: ReasonRenderFailed, // the CART base config is missing
		setup: func(t *testing.T, ns, _ string) (string, []string) {
			configMap(t, ns, "routes", map[string]string{}, nil)
			configMap(t, ns, "app", map[string]string{}, nil)
			service(t, ns, "m", 8000)
			service(t, ns, "cart", 9000)
			endpointSlice(t, ns, "m-1", "m", v4, 8000, up("10.50.0.10"))
			createRoute(t, newRoute(ns, "m", "m", func(r *v1alpha1.ModelRoute) {
				r.Spec.Cart = &v1alpha1.Cart{Discovery: v1alpha1.Discovery{Service: "cart"}, OutputConfigMap: "app"}
			}))
			return "m", []string{ns + "/app|" + compiler.CartKey}
		}},
}

// TestPreviewAgreesWithController: for every reason that keeps a route
// from writing, the preview (autoconfig diff) of the cluster state the
// controller acted on says what the controller's status says: the same
// Ready status, reason and message, and the keys held back are refused,
// not shown as changes. A reason without a case fails the test.
func TestPreviewAgreesWithController(t *testing.T) {
	for _, reason := range precedence {
		if !slices.ContainsFunc(agreeCases, func(c agreeCase) bool { return c.reason == reason }) {
			t.Errorf("reason %s has no preview agreement case: add one to agreeCases (or say why a preview cannot know it)", reason)
		}
	}
	v, err := schema.Default()
	must(t, err)
	for i, c := range agreeCases {
		t.Run(fmt.Sprintf("%s-%d", c.reason, i), func(t *testing.T) {
			if c.unknowable != "" {
				t.Skipf("a preview cannot know %s: %s", c.reason, c.unknowable)
			}
			ns, other := namespace(t, "agree"), namespace(t, "agree-other")
			var watch []string
			if c.watch != nil {
				watch = c.watch(ns, other)
			}
			newHarnessFull(t, testCfg, nil, watch...)
			name, keys := c.setup(t, ns, other)
			routeNS := ns
			if n, at, ok := strings.Cut(name, "@"); ok {
				name, routeNS = n, at
			}
			waitCondition(t, routeNS, name, metav1.ConditionFalse, c.reason)
			pv := NewPreviewer(k8s, v, compiler.Options{}, watch, nil)
			var p *Preview
			eventually(t, "the preview to say what the status says", func() (bool, string) {
				route := getRoute(t, routeNS, name)
				ready := findCond(route, TypeReady)
				var err error
				if p, err = pv.Preview(context.Background(), route); err != nil {
					return false, err.Error()
				}
				got := fmt.Sprintf("%s/%s: %s", p.Ready.Status, p.Ready.Reason, p.Ready.Message)
				want := fmt.Sprintf("%s/%s: %s", ready.Status, ready.Reason, ready.Message)
				return got == want, "preview: " + got + "\nstatus:  " + want
			})
			for _, k := range keys {
				cm, key, _ := strings.Cut(k, "|")
				i := slices.IndexFunc(p.Outputs, func(o PreviewOutput) bool { return o.ConfigMap == cm && o.Key == key })
				if i < 0 {
					t.Errorf("key %s not in the preview: %+v", k, p.Outputs)
					continue
				}
				o := p.Outputs[i]
				if o.Changed() || !slices.ContainsFunc(o.Refused, func(r Refusal) bool { return r.Reason == c.reason }) {
					t.Errorf("key %s: changed=%v refused=%v; want refused for %s", k, o.Changed(), o.Refused, c.reason)
				}
			}
			if len(keys) == 0 {
				for _, o := range p.Outputs {
					if o.Changed() {
						t.Errorf("key %s/%s shown as a change while the controller writes nothing", o.ConfigMap, o.Key)
					}
				}
			}
		})
	}
}
