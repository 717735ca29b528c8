package controller

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TestCacheKeepsWhatIsRead: the manager's cache holds EndpointSlices and
// Services cut down to what the controller reads (stripUnread in informer.CacheOptions), and a
// route that reads every part of them — the Service VIP found by port
// name among several ports, a canary Service granted by its annotation,
// the CART, the nginx entry's dispatch port and its consumer pod (the
// slice's target and the Service's selector), monitor lines with the
// nodes' GPU — renders from the cache exactly what a preview renders from
// the full objects of the API server, and its consumer is tracked. Every
// object carries the fields the controller does not read (zones, hints,
// hostnames, target UIDs, owner references, annotations, traffic
// policies), so a transform that dropped a read field, or a reader that
// starts reading a dropped one, fails here.
func TestCacheKeepsWhatIsRead(t *testing.T) {
	h := startManager(t)
	ctx := context.Background()
	ns, models := namespace(t, "strip"), namespace(t, "strip-models")
	node := "strip-gpu-" + ns
	must(t, k8s.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{discovery.GPUProductLabel: "NVIDIA-H100-80GB-HBM3", "zone": "a"}}}))
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}) })
	configMap(t, ns, "routes", nil, nil)
	configMap(t, ns, "cart", map[string]string{"config.yaml": "server:\n  port: 9000\nworkers: []\n"}, nil)
	configMap(t, ns, "monitor", nil, nil)

	svc := func(ns, name string, selector, annotations map[string]string, ports ...corev1.ServicePort) {
		ann := map[string]string{"example.com/note": strings.Repeat("x", 200)}
		for k, v := range annotations {
			ann[k] = v
		}
		must(t, k8s.Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name, ManagedByLabel: "helm"}, Annotations: ann},
			Spec: corev1.ServiceSpec{
				Selector: selector, Ports: ports,
				SessionAffinity: corev1.ServiceAffinityClientIP, PublishNotReadyAddresses: true,
				IPFamilyPolicy:        ptr(corev1.IPFamilyPolicySingleStack),
				InternalTrafficPolicy: ptr(corev1.ServiceInternalTrafficPolicyLocal),
			},
		}))
	}
	tcp := func(name string, port int32, target intstr.IntOrString) corev1.ServicePort {
		return corev1.ServicePort{Name: name, Port: port, TargetPort: target, Protocol: corev1.ProtocolTCP, AppProtocol: ptr("http")}
	}
	slice := func(ns, name, svc string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) {
		must(t, k8s.Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
				Labels:      map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "test", "app": svc},
				Annotations: map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       ports,
			Endpoints:   eps,
		}))
	}
	endpoint := func(ip string, ready bool, ns, pod string) discoveryv1.Endpoint {
		e := discoveryv1.Endpoint{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(ready), Terminating: ptr(false)},
			NodeName:   ptr(node), Zone: ptr("a"), Hostname: ptr("h" + strings.ReplaceAll(ip, ".", "-")),
			Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "a"}}},
		}
		if pod != "" {
			e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod, UID: types.UID("uid-" + pod)}
		}
		return e
	}
	port := func(name string, p int32) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Name: ptr(name), Port: ptr(p), Protocol: ptr(corev1.ProtocolTCP), AppProtocol: ptr("http")}
	}

	// Backends: the VIP's port is the Service port whose name is the
	// slice's ("http" → 80, not the first port).
	svc(ns, "qwen", map[string]string{"app": "qwen"}, nil, tcp("metrics", 9090, intstr.FromInt32(9090)), tcp("http", 80, intstr.FromString("http")))
	slice(ns, "qwen-1", "qwen", []discoveryv1.EndpointPort{port("http", 8000)},
		endpoint("10.70.0.1", true, ns, "qwen-0"), endpoint("10.70.0.2", true, ns, "qwen-1"), endpoint("10.70.0.3", false, ns, "qwen-2"))
	svc(models, "qwen-v2", nil, map[string]string{sink.AllowedNamespacesAnnotation: ns}, tcp("http", 80, intstr.FromInt32(8000)))
	slice(models, "qwen-v2-1", "qwen-v2", []discoveryv1.EndpointPort{port("http", 8000)}, endpoint("10.71.0.1", true, models, "qwen-v2-0"))
	svc(ns, "cart", nil, nil, tcp("http", 9000, intstr.FromInt32(9000)))
	slice(ns, "cart-1", "cart", []discoveryv1.EndpointPort{port("http", 9000)}, endpoint("10.72.0.1", true, ns, ""))
	// The nginx entry: its dispatch port by name among two, and its pod
	// behind the Service (selector) and the slice (target).
	must(t, k8s.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "entry-0", Labels: map[string]string{"app": "entry"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "openresty", Image: "openresty"}}},
	}))
	svc(ns, "entry", map[string]string{"app": "entry"}, nil, tcp("http", 80, intstr.FromInt32(8081)), tcp(discovery.DispatchPortName, 8080, intstr.FromInt32(8080)))
	slice(ns, "entry-1", "entry", []discoveryv1.EndpointPort{port("http", 8081), port(discovery.DispatchPortName, 8080)}, endpoint("10.73.0.1", true, ns, "entry-0"))

	createRoute(t, newRoute(ns, "qwen", "qwen", func(r *v1alpha1.ModelRoute) {
		r.Spec.Nginx.Peers = []v1alpha1.Peer{{Use: v1alpha1.UseBackend, Priority: 2}, {Use: v1alpha1.UseBackendSvc, Priority: 1}}
		r.Spec.Nginx.Service = "entry"
		r.Spec.Canary = &v1alpha1.Canary{Discovery: v1alpha1.Discovery{Service: models + "/qwen-v2"}, Weight: 10}
		r.Spec.Cart = &v1alpha1.Cart{Discovery: v1alpha1.Discovery{Service: "cart"}, OutputConfigMap: "cart"}
		r.Spec.Monitor = &v1alpha1.Monitor{OutputConfigMap: "monitor"}
	}))
	rt := waitCondition(t, ns, "qwen", metav1.ConditionTrue, ReasonReconciled)
	if rt.Status.Backends != 2 || rt.Status.CanaryBackends != 1 || rt.Status.CartPeers != 1 {
		t.Fatalf("status backends %d, canary %d, cart peers %d; want 2, 1, 1", rt.Status.Backends, rt.Status.CanaryBackends, rt.Status.CartPeers)
	}

	// The cache holds exactly the stripped objects.
	type obj struct {
		key          types.NamespacedName
		live, cached client.Object
		strip        func(client.Object) client.Object
	}
	stripSlice := func(o client.Object) client.Object {
		s, err := discovery.StripEndpointSlice(o)
		must(t, err)
		return s.(client.Object)
	}
	stripSvc := func(o client.Object) client.Object {
		s, err := CacheOptions(nil).DefaultTransform(o)
		must(t, err)
		return s.(client.Object)
	}
	var objs []obj
	for _, k := range []types.NamespacedName{{Namespace: ns, Name: "qwen-1"}, {Namespace: models, Name: "qwen-v2-1"}, {Namespace: ns, Name: "cart-1"}, {Namespace: ns, Name: "entry-1"}} {
		objs = append(objs, obj{key: k, live: &discoveryv1.EndpointSlice{}, cached: &discoveryv1.EndpointSlice{}, strip: stripSlice})
	}
	for _, k := range []types.NamespacedName{{Namespace: ns, Name: "qwen"}, {Namespace: models, Name: "qwen-v2"}, {Namespace: ns, Name: "cart"}, {Namespace: ns, Name: "entry"}} {
		objs = append(objs, obj{key: k, live: &corev1.Service{}, cached: &corev1.Service{}, strip: stripSvc})
	}
	for _, o := range objs {
		eventually(t, "the cache to hold "+o.key.String()+" stripped", func() (bool, string) {
			if err := k8s.Get(ctx, o.key, o.live); err != nil {
				return false, err.Error()
			}
			if err := h.r.Client.Get(ctx, o.key, o.cached); err != nil {
				return false, err.Error()
			}
			want := o.strip(o.live)
			o.cached.GetObjectKind().SetGroupVersionKind(want.GetObjectKind().GroupVersionKind())
			return reflect.DeepEqual(o.cached, want), "cached " + fmt.Sprintf("%+v", o.cached) + "\nwant   " + fmt.Sprintf("%+v", want)
		})
		if len(o.cached.GetAnnotations()) > 1 || o.cached.GetAnnotations()["example.com/note"] != "" || len(o.cached.GetLabels()) > 1 {
			t.Errorf("%s: unread labels or annotations cached: %v %v", o.key, o.cached.GetLabels(), o.cached.GetAnnotations())
		}
		switch c := o.cached.(type) {
		case *discoveryv1.EndpointSlice:
			e := c.Endpoints[0]
			if e.Zone != nil || e.Hints != nil || e.Hostname != nil || e.Conditions.Serving != nil || c.Ports[0].Protocol != nil {
				t.Errorf("%s: unread endpoint fields cached: %+v", o.key, c)
			}
		case *corev1.Service:
			if c.Spec.SessionAffinity != "" || c.Spec.IPFamilyPolicy != nil || c.Spec.InternalTrafficPolicy != nil || c.Spec.Ports[0].AppProtocol != nil {
				t.Errorf("%s: unread spec fields cached: %+v", o.key, c.Spec)
			}
		}
	}

	// What the controller wrote from the cache is what a preview renders
	// from the full objects.
	v, err := schema.Default()
	must(t, err)
	p, err := NewPreviewer(k8s, v, compiler.Options{}, nil, nil).Preview(ctx, getRoute(t, ns, "qwen"))
	must(t, err)
	if len(p.Problems) > 0 {
		t.Fatalf("preview problems: %v", p.Problems)
	}
	keys := map[string]string{}
	for _, o := range p.Outputs {
		if o.Changed() || len(o.Refused) > 0 {
			t.Errorf("%s %s: the controller wrote %q, a preview from the full objects renders %q (refused %v)", o.ConfigMap, o.Key, o.Live, o.Rendered, o.Refused)
		}
		keys[o.ConfigMap+"|"+o.Key] = string(o.Live)
	}
	var qwen corev1.Service
	must(t, k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "qwen"}, &qwen))
	for k, want := range map[string][]string{
		ns + "/routes|" + routeKey("qwen"): {host("10.70.0.1"), host("10.70.0.2"), host("10.71.0.1"), host(qwen.Spec.ClusterIP) + ", [ \"port\" ] = 80"},
		ns + "/cart|" + compiler.CartKey:   {"http://10.70.0.1:8000", "http://10.70.0.2:8000"},
	} {
		if got, ok := keys[k]; !ok || !hasAll(got, want, []string{host("10.70.0.3")}) {
			t.Errorf("%s: want %q in\n%s", k, want, got)
		}
	}
	var monitor string
	for k, c := range keys {
		if strings.HasPrefix(k, ns+"/monitor|") {
			monitor = c
		}
	}
	if !hasAll(monitor, []string{"gpu_type=H100 endpoint=10.70.0.1:8000", "nginx: endpoint=10.73.0.1:8080", "router: url=http://10.72.0.1:9000/workers"}, nil) {
		t.Errorf("monitor lines: %s", monitor)
	}

	// The consumer pod found through the slice's target and the Service's
	// selector is tracked.
	content, _ := cmKey(t, ns, "routes", routeKey("qwen"))
	reportServed(t, ns, "entry-0", routeKey("qwen"), content)
	waitApplied(t, ns, "qwen", metav1.ConditionTrue, ReasonSynced, "1/1")
}
