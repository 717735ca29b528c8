package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/controller"
	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/internal/reload/reloadtest"
	servedpkg "github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/internal/testenv"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// appliedEnv is the end-to-end setup: API server, controller, nginx
// (openresty-0) with its reload sidecar in API mode reporting on its pod,
// and the route qwen whose consumers are the pods behind Service openresty.
type appliedEnv struct {
	k8s        client.Client
	kubeconfig string
	dir0       string
	s0         *sidecar
	backends   func(ips ...string)
	consumers  func(pods ...string)
	newPod     func(name string)
	// n0 is openresty-0's nginx.
	n0 *nginxtest.Nginx
}

const appliedNS = "llm"

// startAppliedEnv starts it; debounce is openresty-0's sidecar's --debounce.
func startAppliedEnv(t testing.TB, debounce string) *appliedEnv {
	t.Helper()
	return startAppliedEnvWith(t, debounce, false)
}

// startAppliedEnvWith is startAppliedEnv; with dynamic the routes
// ConfigMap declares dynamic peers and openresty-0 runs the shipped
// nginx.conf (whose engine listens on the control socket).
func startAppliedEnvWith(t testing.TB, debounce string, dynamic bool) *appliedEnv {
	t.Helper()
	return startAppliedEnvOpts(t, appliedOpts{debounce: debounce, dynamic: dynamic})
}

// appliedOpts vary the end-to-end setup.
type appliedOpts struct {
	debounce string
	dynamic  bool
	// noBackends: Service qwen starts with no EndpointSlice (else one
	// naming 10.1.0.1).
	noBackends bool
	// routes are the routes created (nil = route qwen, one backend tier).
	routes []*v1alpha1.ModelRoute
	// sidecarArgs are more flags of openresty-0's sidecar.
	sidecarArgs []string
	// qwenSelector is Service qwen's pod selector (nil: none, its
	// EndpointSlices written by the test).
	qwenSelector map[string]string
}

func startAppliedEnvOpts(t testing.TB, o appliedOpts) *appliedEnv {
	t.Helper()
	const ns = appliedNS
	debounce, dynamic := o.debounce, o.dynamic
	_, cfg := testenv.Start(t)
	sch := k8sruntime.NewScheme()
	testbin.Must(t, clientgoscheme.AddToScheme(sch))
	testbin.Must(t, v1alpha1.AddToScheme(sch))
	k8s, err := client.New(cfg, client.Options{Scheme: sch})
	testbin.Must(t, err)
	ctx := context.Background()
	kubeconfig := writeKubeconfig(t, cfg.Host, cfg.CAData, cfg.CertData, cfg.KeyData)

	testbin.Must(t, k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	var cmAnnotations map[string]string
	if dynamic {
		cmAnnotations = map[string]string{peers.Annotation: "true"}
	}
	testbin.Must(t, k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "routes", Annotations: cmAnnotations}}))
	for _, svc := range []string{"qwen", "openresty"} {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svc},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 8000, TargetPort: intstr.FromInt32(8000)}}},
		}
		if svc == "qwen" {
			s.Spec.Selector = o.qwenSelector
		}
		testbin.Must(t, k8s.Create(ctx, s))
	}
	backends := func(ips ...string) {
		t.Helper()
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: "qwen-a", Labels: map[string]string{discoveryv1.LabelServiceName: "qwen"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8000))}},
		}
		for _, ip := range ips {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
		}
		applySlice(t, k8s, s)
	}
	consumers := func(pods ...string) {
		t.Helper()
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: "openresty-a", Labels: map[string]string{discoveryv1.LabelServiceName: "openresty"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}},
		}
		for i, p := range pods {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
				Addresses: []string{"10.20.0." + string(rune('1'+i))}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: p},
			})
		}
		applySlice(t, k8s, s)
	}
	newPod := func(name string) {
		t.Helper()
		testbin.Must(t, k8s.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "openresty"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "openresty", Image: "openresty"}, {Name: "reload", Image: "reload"}}},
		}))
	}
	if !o.noBackends {
		backends("10.1.0.1")
	}
	newPod("openresty-0")
	consumers("openresty-0")

	// openresty-0: nginx with the reference lua router, and its sidecar.
	root, err := testbin.ModuleRoot()
	testbin.Must(t, err)
	dir0 := t.TempDir()
	opts := nginxtest.Options{RoutesDir: dir0, LuaPackagePath: filepath.Join(root, "deploy", "openresty", "lua", "?.lua")}
	if dynamic {
		opts = nginxtest.Options{RoutesDir: dir0, Reference: true}
	}
	n0 := nginxtest.Start(t, opts)
	s0 := startSidecar(t, append([]string{"--configmap", ns + "/routes", "--write-dir", dir0, "--kubeconfig", kubeconfig,
		"--process", n0.MasterMatch(), "--sock-dir", n0.SockDir(), "--check-cmd", checkCmd(n0),
		"--pod-name", "openresty-0", "--pod-namespace", ns, "--debounce", debounce}, o.sidecarArgs...)...)

	// The controller, rendering for nginx's socket directory.
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: sch, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Cache: controller.CacheOptions(nil), Controller: config.Controller{SkipNameValidation: ptr(true)}})
	testbin.Must(t, err)
	v, err := schema.Default()
	testbin.Must(t, err)
	r := &controller.Reconciler{Validator: v, CompileOptions: compiler.Options{SockDir: n0.SockDir()}, Recorder: mgr.GetEventRecorder(controller.Name)}
	mctx, cancel := context.WithCancel(ctx)
	testbin.Must(t, r.SetupWithManager(mctx, mgr, 4))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() { cancel(); <-done })

	routes := o.routes
	if routes == nil {
		routes = []*v1alpha1.ModelRoute{{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen"},
			Spec: v1alpha1.Spec{
				Discovery: v1alpha1.Discovery{Service: "qwen"},
				Nginx:     v1alpha1.Nginx{OutputConfigMap: "routes", Service: "openresty", Peers: []v1alpha1.Peer{{Use: v1alpha1.UseBackend, Priority: 2}}},
			},
		}}
	}
	for _, rt := range routes {
		testbin.Must(t, k8s.Create(ctx, rt))
	}
	return &appliedEnv{k8s: k8s, kubeconfig: kubeconfig, dir0: dir0, s0: s0, backends: backends, consumers: consumers, newPod: newPod, n0: n0}
}

// appliedKey is the route file of route qwen.
const appliedKey = "session_route_qwen.conf"

// TestAppliedEndToEnd: the controller, a real nginx fed by the real reload
// sidecar in API mode reporting what it serves on its pod (--pod-name), on
// a real API server. The route's Applied condition follows what nginx has
// loaded: True 1/1 once the sidecar reloaded it; after a scale-out False,
// then True again when the new file is served. A second consumer pod whose
// sidecar's check refuses every content keeps serving nothing new: Applied
// False naming that pod, the first one Synced.
func TestAppliedEndToEnd(t *testing.T) {
	const ns = appliedNS
	// A debounce long enough that the Stale state between the write and
	// the reload is seen even on a loaded machine (the poll is 5 ms).
	e := startAppliedEnv(t, "500ms")
	k8s, dir0, s0, kubeconfig, backends, consumers, newPod := e.k8s, e.dir0, e.s0, e.kubeconfig, e.backends, e.consumers, e.newPod
	ctx := context.Background()
	key := appliedKey
	applied := func(status metav1.ConditionStatus, reason, synced string, msgHas ...string) *v1alpha1.ModelRoute {
		t.Helper()
		var rt v1alpha1.ModelRoute
		var last string
		testbin.WaitFor(t, wait, "Applied="+string(status)+"/"+reason+" synced="+synced, func() bool {
			testbin.Must(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "qwen"}, &rt))
			c := meta.FindStatusCondition(rt.Status.Conditions, controller.TypeApplied)
			if c == nil {
				return false
			}
			last = string(c.Status) + "/" + c.Reason + " " + rt.Status.Synced + ": " + c.Message
			ok := c.Status == status && c.Reason == reason && rt.Status.Synced == synced
			for _, m := range msgHas {
				ok = ok && strings.Contains(c.Message, m)
			}
			return ok
		})
		t.Logf("Applied: %s", last)
		return &rt
	}
	onDisk := func(ip string) bool {
		b, err := os.ReadFile(filepath.Join(dir0, key))
		return err == nil && strings.Contains(string(b), `"`+ip+`"`)
	}

	applied(metav1.ConditionTrue, controller.ReasonSynced, "1/1")
	if !onDisk("10.1.0.1") {
		t.Fatal("Applied=True before nginx's route file holds the backend")
	}
	s0.waitCount(t, 1, "result=success")

	// Scale out: Applied goes False in the reconcile that writes the new
	// file (openresty-0 still serves the old one), then True once the
	// sidecar reloaded nginx with it.
	backends("10.1.0.1", "10.1.0.2")
	applied(metav1.ConditionFalse, controller.ReasonStale, "0/1", "openresty-0")
	applied(metav1.ConditionTrue, controller.ReasonSynced, "1/1")
	if !onDisk("10.1.0.2") {
		t.Fatal("Applied=True before nginx's route file holds the new backend")
	}

	// openresty-1 joins; its sidecar's check refuses everything, so its
	// target is never signalled and it serves nothing of the route.
	newPod("openresty-1")
	dir1 := t.TempDir()
	name := "cart-like-" + strings.ReplaceAll(t.Name(), "/", "-")
	reloadtest.StartHUPCounter(t, name)
	s1 := startSidecar(t, "--configmap", ns+"/routes", "--write-dir", dir1, "--kubeconfig", kubeconfig,
		"--process", name, "--check-cmd", "false", "--pod-name", "openresty-1", "--pod-namespace", ns, "--debounce", "100ms")
	consumers("openresty-0", "openresty-1")
	rt := applied(metav1.ConditionFalse, controller.ReasonStale, "1/2", "do not serve the current "+key+" yet: openresty-1")
	refused := "configuration check fails on the last good content too"
	s1.waitCount(t, 1, refused)
	// The verdict holds until the content or the resync changes: the
	// sidecar's own trial writes do not start the search again (they did,
	// every --debounce). Ten debounces of quiet:
	time.Sleep(time.Second)
	if n := s1.count(refused); n != 1 {
		t.Fatalf("the refused content was checked %d times without a change, want once", n)
	}
	for _, c := range rt.Status.Consumers {
		want := v1alpha1.ConsumerSynced
		if c.Pod == ns+"/openresty-1" {
			want = v1alpha1.ConsumerStale
		}
		if c.State != want {
			t.Fatalf("consumer %s: %s, want %s (%+v)", c.Pod, c.State, want, rt.Status.Consumers)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func applySlice(t testing.TB, k8s client.Client, s *discoveryv1.EndpointSlice) {
	t.Helper()
	ctx := context.Background()
	var cur discoveryv1.EndpointSlice
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(s), &cur); err == nil {
		s.ResourceVersion = cur.ResourceVersion
		testbin.Must(t, k8s.Update(ctx, s))
		return
	}
	testbin.Must(t, k8s.Create(ctx, s))
}

// writeKubeconfig writes a kubeconfig for the sidecars (the envtest admin).
func writeKubeconfig(t testing.TB, host string, ca, cert, key []byte) string {
	t.Helper()
	c := clientcmdapi.NewConfig()
	c.Clusters["envtest"] = &clientcmdapi.Cluster{Server: host, CertificateAuthorityData: ca}
	c.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	c.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	c.CurrentContext = "envtest"
	p := filepath.Join(t.TempDir(), "kubeconfig")
	testbin.Must(t, clientcmd.WriteToFile(*c, p))
	return p
}

// BenchmarkEndpointChangeToServed: an EndpointSlice change of the route's
// backends, timed to the controller's write of the changed key into the
// ConfigMap (write) and to openresty-0 reporting that it serves that
// content (served). p50/p99 over b.N changes. The sidecar runs with
// --debounce 100ms. Without dynamic peers the changed key is the route
// file (the sidecar saw it, waited its debounce, ran nginx -t, reloaded
// nginx and recorded the new content on its pod); with dynamic peers
// (peers=N: the routes ConfigMap declares them, N backends) it is the
// peers table, pushed into the running engine and acknowledged.
func BenchmarkEndpointChangeToServed(b *testing.B) {
	b.Run("reload", func(b *testing.B) { benchEndpointChange(b, false, 1) })
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("dynamic/peers=%d", n), func(b *testing.B) { benchEndpointChange(b, true, n) })
	}
}

func benchEndpointChange(b *testing.B, dynamic bool, peersN int) {
	e := startAppliedEnvWith(b, "100ms", dynamic)
	ctx := context.Background()
	key := appliedKey
	if dynamic {
		key = peers.Key("qwen")
	}
	cm := func() string {
		var c corev1.ConfigMap
		testbin.Must(b, e.k8s.Get(ctx, client.ObjectKey{Namespace: appliedNS, Name: "routes"}, &c))
		return c.Data[key]
	}
	served := func() string {
		var p corev1.Pod
		testbin.Must(b, e.k8s.Get(ctx, client.ObjectKey{Namespace: appliedNS, Name: "openresty-0"}, &p))
		r, err := servedpkg.Parse(p.Annotations[servedpkg.Annotation])
		if err != nil {
			return ""
		}
		return r.Keys[key]
	}
	poll := func(what string, cond func() bool) time.Time {
		deadline := time.Now().Add(wait)
		for !cond() {
			if time.Now().After(deadline) {
				b.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return time.Now()
	}
	base := make([]string, 0, peersN)
	for i := range peersN - 1 {
		base = append(base, fmt.Sprintf("10.2.%d.%d", i/250, 1+i%250))
	}
	quote := func(ip string) string {
		if dynamic {
			return `"host":"` + ip + `"`
		}
		return `"` + ip + `"`
	}
	// The route's first render (a reload: the route is new) is not timed.
	poll("openresty-0 to serve the route", func() bool { c := cm(); return c != "" && served() == servedpkg.ID([]byte(c)) })
	var writes, serves []time.Duration
	b.ResetTimer()
	for i := range b.N {
		ip := fmt.Sprintf("10.1.%d.%d", 1+i/250, 1+i%250)
		start := time.Now()
		e.backends(append(slices.Clone(base), ip)...)
		var content string
		wrote := poll("the changed key with "+ip, func() bool { content = cm(); return strings.Contains(content, quote(ip)) })
		id := servedpkg.ID([]byte(content))
		done := poll("openresty-0 to serve it", func() bool { return served() == id })
		writes, serves = append(writes, wrote.Sub(start)), append(serves, done.Sub(start))
	}
	b.StopTimer()
	pct := testbin.PercentileMs
	b.ReportMetric(pct(writes, 0.5), "write-p50-ms")
	b.ReportMetric(pct(writes, 0.99), "write-p99-ms")
	b.ReportMetric(pct(serves, 0.5), "served-p50-ms")
	b.ReportMetric(pct(serves, 0.99), "served-p99-ms")
}
