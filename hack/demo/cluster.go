package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// allowedNamespacesAnnotation lets routes of other namespaces write a
// ConfigMap (internal/sink.AllowedNamespacesAnnotation; spelled out here
// as a consumer chart would).
const allowedNamespacesAnnotation = "routing.modelsphere.dev/allowed-route-namespaces"

// gpuLabel is the node label the monitor output's gpu type comes from.
const gpuLabel = "nvidia.com/gpu.product"

var modelRouteGVK = schema.GroupVersionKind{Group: "routing.modelsphere.dev", Version: "v1alpha1", Kind: "ModelRoute"}

// cartBase is the CART chart's config.yaml: autoconfig rewrites only the
// workers section and keeps the rest (comments too).
const cartBase = `# written by the CART chart; autoconfig refills workers only
server:
  host: 0.0.0.0
  port: 9000
cache:
  max_tree_size: 1048576   # prefix tree eviction
health:
  check_interval_secs: 5
  path: /health
workers: []
policy: cache_aware
`

// setupCluster creates what the consumers' own charts would: namespaces,
// the output ConfigMaps (autoconfig never creates them), Services and the
// CART / nginx entry endpoints, and GPU nodes.
func (d *demo) setupCluster(ctx context.Context) error {
	var objs []client.Object
	for _, ns := range []string{routeNS, monitorNS, llmBackendNS, videoNS} {
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	for _, n := range []string{"gpu-a", "gpu-b"} {
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{gpuLabel: "NVIDIA-H100-80GB-HBM3"}}})
	}
	objs = append(objs,
		// openresty chart: one ConfigMap for every route file, in the
		// routes' own namespace (no opt-in needed).
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: routeNS, Name: nginxCM}},
		// CART chart: the base config.
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: routeNS, Name: cartCM}, Data: map[string]string{"config.yaml": cartBase}},
		// monitoring agent: another namespace, so it opts in to writes from
		// the routes' namespace.
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: monitorNS, Name: monitorCM,
			Annotations: map[string]string{allowedNamespacesAnnotation: routeNS}}},
		// Headless here: the demo has no kube-proxy, so a ClusterIP
		// would lead nowhere. The llm route's cart tier (CART VIP) and
		// backend-svc tier (backend VIP) are skipped with a warning and
		// the backend pod-IP tier serves.
		// The models' Services live in their own namespaces and grant
		// the routes' namespace, as the monitoring ConfigMap does.
		granted(headless(service(llmBackendNS, "qwen", "http", 8000))),
		granted(service(videoNS, "wan", "http", 8000)),
		headless(service(routeNS, "qwen-cart", "http", 9000)),
		service(routeNS, "openresty", "dispatch", 8080),
	)
	for _, o := range objs {
		if err := d.c.Create(ctx, o); err != nil {
			return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	// CART (master-standby, two pods) and the nginx entry: simulated pod
	// addresses; nothing connects to them in the demo.
	if err := d.setEndpoints(ctx, routeNS, "qwen-cart", "http", []endpoint{{ip: "10.244.2.1", port: 9000}, {ip: "10.244.2.2", port: 9000}}); err != nil {
		return err
	}
	// The nginx entry's pod: its reload sidecar (--pod-name) records on
	// it what nginx serves, which the llm route's status shows (SYNCED).
	if err := d.c.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: routeNS, Name: openrestyPod, Labels: map[string]string{"app": "openresty"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "openresty", Image: "openresty"}, {Name: "reload", Image: "reload"}}},
	}); err != nil {
		return fmt.Errorf("create pod %s: %w", openrestyPod, err)
	}
	if err := d.setEndpoints(ctx, routeNS, "openresty", "dispatch", []endpoint{{ip: "10.244.3.1", port: 8080, pod: openrestyPod}}); err != nil {
		return err
	}
	d.say("namespaces %s, %s, %s, %s; nodes gpu-a, gpu-b (%s=NVIDIA-H100-80GB-HBM3)", routeNS, monitorNS, llmBackendNS, videoNS, gpuLabel)
	d.say("ConfigMaps %s/%s (empty), %s/%s (CART base config), %s/%s (annotated %s=%s)",
		routeNS, nginxCM, routeNS, cartCM, monitorNS, monitorCM, allowedNamespacesAnnotation, routeNS)
	d.say("Services llm/qwen, video/wan (no endpoints yet; annotated %s=%s), llm-route/qwen-cart (2 pods), llm-route/openresty (pod %s: this demo's nginx)", allowedNamespacesAnnotation, routeNS, openrestyPod)
	d.say("llm/qwen and llm-route/qwen-cart are headless (no kube-proxy here): the qwen route's cart and backend-svc tiers are skipped, its backend pods serve")
	return nil
}

func service(ns, name, portName string, port int32) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{Name: portName, Port: port, TargetPort: intstr.FromInt32(port), Protocol: corev1.ProtocolTCP}},
		},
	}
}

// granted annotates s to grant the routes' namespace (a route in another
// namespace reads a Service only with it, or from a trusted namespace).
func granted(s *corev1.Service) *corev1.Service {
	s.Annotations = map[string]string{allowedNamespacesAnnotation: routeNS}
	return s
}

// headless makes s a Service without a ClusterIP.
func headless(s *corev1.Service) *corev1.Service {
	s.Spec.ClusterIP = corev1.ClusterIPNone
	return s
}

// endpoint is one backend address.
type endpoint struct {
	ip   string
	port int32
	node string
	pod  string // the pod behind it (targetRef), in the Service's namespace
}

// setEndpoints makes the Service's EndpointSlices hold exactly eps, as the
// EndpointSlice controller would: one slice per distinct port (the demo's
// local backends each listen on their own port of one address).
func (d *demo) setEndpoints(ctx context.Context, ns, svc, portName string, eps []endpoint) error {
	byPort := map[int32][]discoveryv1.Endpoint{}
	for _, e := range eps {
		ep := discoveryv1.Endpoint{
			Addresses:  []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
		}
		if e.node != "" {
			ep.NodeName = ptr(e.node)
		}
		if e.pod != "" {
			ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: e.pod}
		}
		byPort[e.port] = append(byPort[e.port], ep)
	}
	want := map[string]bool{}
	for port, list := range byPort {
		name := svc + "-" + strconv.Itoa(int(port))
		want[name] = true
		addrType := discoveryv1.AddressTypeIPv4
		if len(list) > 0 && isIPv6(list[0].Addresses[0]) {
			addrType = discoveryv1.AddressTypeIPv6
		}
		s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		err := d.c.Get(ctx, client.ObjectKeyFromObject(s), s)
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		s.Labels = map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "demo"}
		s.AddressType = addrType
		s.Endpoints = list
		s.Ports = []discoveryv1.EndpointPort{{Name: ptr(portName), Port: ptr(port), Protocol: ptr(corev1.ProtocolTCP)}}
		if apierrors.IsNotFound(err) {
			err = d.c.Create(ctx, s)
		} else {
			err = d.c.Update(ctx, s)
		}
		if err != nil {
			return fmt.Errorf("endpointslice %s/%s: %w", ns, name, err)
		}
	}
	var list discoveryv1.EndpointSliceList
	if err := d.c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: svc}); err != nil {
		return err
	}
	for i := range list.Items {
		if !want[list.Items[i].Name] {
			if err := d.c.Delete(ctx, &list.Items[i]); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	return nil
}

func isIPv6(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			return true
		}
	}
	return false
}

func ptr[T any](v T) *T { return &v }

// applySamples creates the sample routes exactly as written in
// deploy/samples (unstructured: the demo does not need the Go types).
func (d *demo) applySamples(ctx context.Context) error {
	for _, f := range []string{"modelroute-llm.yaml", "modelroute-video.yaml"} {
		b, err := os.ReadFile(filepath.Join(d.root, "deploy", "samples", f))
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if err := d.c.Create(ctx, u); err != nil {
			return fmt.Errorf("apply %s: %w", f, err)
		}
	}
	return nil
}

// routeRow is one line of the `kubectl get mr` table.
type routeRow struct {
	ns, name           string
	backends, cart     string
	canary             string // spec.canary.weight
	synced             string
	ready, reason, msg string
	age                string
	backendsN          int64
}

func (d *demo) routes(ctx context.Context) ([]routeRow, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(modelRouteGVK.GroupVersion().WithKind("ModelRouteList"))
	if err := d.c.List(ctx, list); err != nil {
		return nil, err
	}
	var rows []routeRow
	for _, u := range list.Items {
		r := routeRow{ns: u.GetNamespace(), name: u.GetName()}
		if n, ok, _ := unstructured.NestedInt64(u.Object, "status", "backends"); ok {
			r.backends, r.backendsN = strconv.FormatInt(n, 10), n
		}
		if n, ok, _ := unstructured.NestedInt64(u.Object, "status", "cartPeers"); ok {
			r.cart = strconv.FormatInt(n, 10)
		}
		if n, ok, _ := unstructured.NestedInt64(u.Object, "spec", "canary", "weight"); ok {
			r.canary = strconv.FormatInt(n, 10)
		}
		r.synced, _, _ = unstructured.NestedString(u.Object, "status", "synced")
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Ready" {
				r.ready, _ = m["status"].(string)
				r.reason, _ = m["reason"].(string)
				r.msg, _ = m["message"].(string)
			}
		}
		r.age = age(metav1.Now().Sub(u.GetCreationTimestamp().Time))
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].ns+"/"+rows[i].name < rows[j].ns+"/"+rows[j].name })
	return rows, nil
}

func (d *demo) route(ctx context.Context, name string) (routeRow, bool, error) {
	rows, err := d.routes(ctx)
	if err != nil {
		return routeRow{}, false, err
	}
	for _, r := range rows {
		if r.name == name {
			return r, true, nil
		}
	}
	return routeRow{}, false, nil
}

func (d *demo) configMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	cm := &corev1.ConfigMap{}
	err := d.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cm)
	return cm, err
}
