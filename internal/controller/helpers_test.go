package controller

import (
	"context"
	"os"
	"strconv"

	"fmt"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/internal/testenv"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// Controller logs go to stderr with AUTOCONFIG_TEST_LOG=1 (V level as its
// value, e.g. 2), else nowhere.
func init() {
	v, err := strconv.Atoi(os.Getenv("AUTOCONFIG_TEST_LOG"))
	if err != nil {
		logf.SetLogger(logr.Discard())
		return
	}
	logf.SetLogger(funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: v}))
}

// countingClient counts the writes that matter: ConfigMap patches/updates
// (must be exactly the needed ones), ConfigMap creates (must be zero) and
// status writes.
type countingClient struct {
	client.Client
	cmWrites     atomic.Int64 // successful ConfigMap patches/updates
	cmConflicts  atomic.Int64 // optimistic-lock conflicts (retried)
	cmCreates    atomic.Int64
	statusWrites atomic.Int64

	mu        sync.Mutex
	routeGets map[types.NamespacedName]int // reconciles started, per route
	totalGets int
	// lagging are the routes whose Get returns the copy held here instead
	// of the cache's: the cache behind the API server, as an informer is
	// for a moment after every write (lag, catchUp).
	lagging map[types.NamespacedName]*v1alpha1.ModelRoute
}

// lag makes Get return route as it is now until catchUp: the controller's
// cache does not see the writes made to it in the meantime.
func (c *countingClient) lag(route *v1alpha1.ModelRoute) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lagging == nil {
		c.lagging = map[types.NamespacedName]*v1alpha1.ModelRoute{}
	}
	c.lagging[client.ObjectKeyFromObject(route)] = route.DeepCopy()
}

// catchUp ends lag: Get reads the cache again.
func (c *countingClient) catchUp(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.lagging, key)
}

// Get records route reads: every reconcile starts with one (event mapping
// lists through indexes, it never gets a route).
func (c *countingClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if route, ok := obj.(*v1alpha1.ModelRoute); ok {
		c.mu.Lock()
		if c.routeGets == nil {
			c.routeGets = map[types.NamespacedName]int{}
		}
		c.routeGets[key]++
		c.totalGets++
		stale := c.lagging[key]
		if stale != nil {
			stale.DeepCopyInto(route)
		}
		c.mu.Unlock()
		if stale != nil {
			return nil
		}
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// started returns a copy of the per-route reconcile starts and their total.
func (c *countingClient) started() (map[types.NamespacedName]int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[types.NamespacedName]int, len(c.routeGets))
	for k, v := range c.routeGets {
		m[k] = v
	}
	return m, c.totalGets
}

func (c *countingClient) count(obj client.Object, err error) error {
	_, isCM := obj.(*corev1.ConfigMap)
	if m, ok := obj.(*metav1.PartialObjectMetadata); ok && m.Kind == "ConfigMap" {
		isCM = true // the batched writer patches with a metadata-only response
	}
	if isCM {
		switch {
		case err == nil:
			c.cmWrites.Add(1)
		case apierrors.IsConflict(err):
			c.cmConflicts.Add(1)
		}
	}
	return err
}

func (c *countingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if _, ok := obj.(*corev1.ConfigMap); ok {
		c.cmCreates.Add(1)
	}
	return c.Client.Create(ctx, obj, opts...)
}

func (c *countingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	return c.count(obj, c.Client.Update(ctx, obj, opts...))
}

func (c *countingClient) Patch(ctx context.Context, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
	return c.count(obj, c.Client.Patch(ctx, obj, p, opts...))
}

func (c *countingClient) Status() client.SubResourceWriter {
	return &countingStatus{SubResourceWriter: c.Client.Status(), n: &c.statusWrites}
}

type countingStatus struct {
	client.SubResourceWriter
	n *atomic.Int64
}

func (s *countingStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	s.n.Add(1)
	return s.SubResourceWriter.Update(ctx, obj, opts...)
}

func (s *countingStatus) Patch(ctx context.Context, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
	s.n.Add(1)
	return s.SubResourceWriter.Patch(ctx, obj, p, opts...)
}

// harness is one running manager with the reconciler.
type harness struct {
	c     *countingClient
	r     *Reconciler
	cache cache.Cache
	stop  func()
}

// startManager runs a real manager with the controller, scoped to
// namespaces (as --namespace does), until the test ends or stop is called.
func startManager(t testing.TB, namespaces ...string) *harness {
	t.Helper()
	h := newHarness(t, namespaces...)
	t.Cleanup(h.stop)
	return h
}

// newHarness starts a manager that runs until stop is called.
func newHarness(t testing.TB, namespaces ...string) *harness {
	t.Helper()
	return newHarnessAs(t, testCfg, namespaces...)
}

// newHarnessAs is newHarness with the manager's credentials in cfg.
func newHarnessAs(t testing.TB, cfg *rest.Config, namespaces ...string) *harness {
	t.Helper()
	return newHarnessFull(t, cfg, nil, namespaces...)
}

// newHarnessWith is newHarness with trusted route namespaces
// (--trusted-namespace).
func newHarnessWith(t testing.TB, trusted, namespaces []string) *harness {
	t.Helper()
	return newHarnessFull(t, testCfg, trusted, namespaces...)
}

func newHarnessFull(t testing.TB, cfg *rest.Config, trusted []string, namespaces ...string) *harness {
	t.Helper()
	skip := true
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 testScheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  CacheOptions(namespaces),
		Controller:             config.Controller{SkipNameValidation: &skip},
	})
	if err != nil {
		t.Fatal(err)
	}
	v, err := schema.Default()
	if err != nil {
		t.Fatal(err)
	}
	cc := &countingClient{Client: mgr.GetClient()}
	r := &Reconciler{Client: cc, Validator: v, Recorder: mgr.GetEventRecorder(Name), Namespaces: namespaces, TrustedNamespaces: trusted,
		PodCacheIdle: 300 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.SetupWithManager(ctx, mgr, 4); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	h := &harness{c: cc, r: r, cache: mgr.GetCache()}
	h.stop = func() {
		once.Do(func() {
			cancel()
			// Not t.Errorf: the benchmark's manager outlives its *testing.B.
			if err := <-done; err != nil {
				fmt.Fprintf(os.Stderr, "manager: %v\n", err)
			}
		})
	}
	// A test that fails before its own stop must not leave its manager
	// running into the next tests (reconciles() counts every manager's
	// reconciles in this process).
	if _, ok := t.(*testing.T); ok {
		t.Cleanup(h.stop)
	}
	return h
}

// eventually, namespace and must are the envtest tests' shared
// fixtures (internal/testenv, internal/testbin).
var (
	eventually = testenv.Eventually
	must       = testbin.Must
)

func namespace(t testing.TB, prefix string) string { return testenv.Namespace(t, k8s, prefix) }

// service creates a ClusterIP Service with one port (80 → target).
func service(t testing.TB, ns, name string, target int32) *corev1.Service {
	t.Helper()
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(target)}}},
	}
	must(t, k8s.Create(context.Background(), s))
	return s
}

// backend is one endpoint of a test EndpointSlice.
type backend struct {
	ip          string
	ready       bool
	terminating bool
	node        string
}

func up(ips ...string) []backend {
	out := make([]backend, len(ips))
	for i, ip := range ips {
		out[i] = backend{ip: ip, ready: true}
	}
	return out
}

// endpointSlice creates or replaces slice name of Service svc.
func endpointSlice(t testing.TB, ns, name, svc string, family discoveryv1.AddressType, port int32, eps []backend) {
	t.Helper()
	ctx := context.Background()
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: family,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(port)}},
	}
	for _, b := range eps {
		e := discoveryv1.Endpoint{Addresses: []string{b.ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(b.ready), Terminating: ptr(b.terminating)}}
		if b.node != "" {
			e.NodeName = ptr(b.node)
		}
		s.Endpoints = append(s.Endpoints, e)
	}
	var cur discoveryv1.EndpointSlice
	err := k8s.Get(ctx, client.ObjectKeyFromObject(s), &cur)
	switch {
	case apierrors.IsNotFound(err):
		must(t, k8s.Create(ctx, s))
	case err != nil:
		t.Fatal(err)
	default:
		s.ResourceVersion = cur.ResourceVersion
		must(t, k8s.Update(ctx, s))
	}
}

func ptr[T any](v T) *T { return &v }

// configMap creates a ConfigMap with optional data and annotations.
func configMap(t testing.TB, ns, name string, data, annotations map[string]string) {
	t.Helper()
	must(t, k8s.Create(context.Background(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Data:       data,
	}))
}

func getCM(t testing.TB, ns, name string) (*corev1.ConfigMap, error) {
	t.Helper()
	var cm corev1.ConfigMap
	err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &cm)
	return &cm, err
}

// cmKey reads one key ("" and false when the ConfigMap or key is absent).
func cmKey(t testing.TB, ns, name, key string) (string, bool) {
	cm, err := getCM(t, ns, name)
	if err != nil {
		return "", false
	}
	v, ok := cm.Data[key]
	return v, ok
}

// newRoute builds an llm route: backend tier over discovery.service, output
// into the ConfigMap "routes" of its namespace.
func newRoute(ns, name, svc string, mutate ...func(*v1alpha1.ModelRoute)) *v1alpha1.ModelRoute {
	r := &v1alpha1.ModelRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.Spec{
			Discovery: v1alpha1.Discovery{Service: svc},
			Nginx: v1alpha1.Nginx{
				OutputConfigMap: "routes",
				Peers:           []v1alpha1.Peer{{Use: v1alpha1.UseBackend, Priority: 2}},
			},
		},
	}
	for _, m := range mutate {
		m(r)
	}
	return r
}

// updateRoute changes a route, retrying conflicts with the controller's
// status writes.
func updateRoute(t testing.TB, ns, name string, mutate func(*v1alpha1.ModelRoute)) {
	t.Helper()
	must(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		r := getRoute(t, ns, name)
		mutate(r)
		return k8s.Update(context.Background(), r)
	}))
}

func createRoute(t testing.TB, r *v1alpha1.ModelRoute) {
	t.Helper()
	must(t, k8s.Create(context.Background(), r))
}

func getRoute(t testing.TB, ns, name string) *v1alpha1.ModelRoute {
	t.Helper()
	var r v1alpha1.ModelRoute
	must(t, k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &r))
	return &r
}

// routeKey is the openresty key of route name.
func routeKey(name string) string { return "session_route_" + name + ".conf" }

// hasAll reports whether s contains every want and none of notWant.
func hasAll(s string, want, notWant []string) bool {
	for _, w := range want {
		if !strings.Contains(s, w) {
			return false
		}
	}
	for _, w := range notWant {
		if strings.Contains(s, w) {
			return false
		}
	}
	return true
}

// host is how the compiler writes a peer address.
func host(ip string) string { return fmt.Sprintf("%q", ip) }

// waitKey waits until the route's key holds every want and none of notWant.
func waitKey(t testing.TB, ns, cm, key string, want, notWant []string) string {
	t.Helper()
	var got string
	eventually(t, fmt.Sprintf("%s/%s[%s] to hold %v without %v", ns, cm, key, want, notWant), func() (bool, string) {
		v, ok := cmKey(t, ns, cm, key)
		got = v
		return ok && hasAll(v, want, notWant), fmt.Sprintf("present=%v\n%s", ok, v)
	})
	return got
}

// waitCondition waits for the route's Ready condition to have status and
// reason for the route's current generation.
func waitCondition(t testing.TB, ns, name string, status metav1.ConditionStatus, reason string) *v1alpha1.ModelRoute {
	t.Helper()
	var r *v1alpha1.ModelRoute
	eventually(t, fmt.Sprintf("route %s/%s Ready=%s/%s", ns, name, status, reason), func() (bool, string) {
		r = getRoute(t, ns, name)
		for _, c := range r.Status.Conditions {
			if c.Type == TypeReady {
				return c.Status == status && c.Reason == reason && c.ObservedGeneration == r.Generation,
					fmt.Sprintf("%s/%s gen %d/%d: %s", c.Status, c.Reason, c.ObservedGeneration, r.Generation, c.Message)
			}
		}
		return false, fmt.Sprintf("no Ready condition: %+v", r.Status)
	})
	return r
}

// reconciles reads controller-runtime's reconcile counter for our
// controller, plus the initial syncs' reconciles, from its metrics registry
// (all managers in this process).
func reconciles(t testing.TB) float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "autoconfig_initial_sync_reconciles_total" {
			n += mf.GetMetric()[0].GetCounter().GetValue()
			continue
		}
		if mf.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelIs(m, "controller", Name) {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

func labelIs(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k && l.GetValue() == v {
			return true
		}
	}
	return false
}

// waitQuiet waits until every route in names has started a reconcile more
// often than in since, and every started reconcile has finished
// (controller-runtime's reconcile counter caught up with the starts).
func waitQuiet(t testing.TB, h *harness, metricBase float64, since map[types.NamespacedName]int, names ...types.NamespacedName) {
	t.Helper()
	eventually(t, "every route reconciled and no reconcile in flight", func() (bool, string) {
		per, total := h.c.started()
		for _, n := range names {
			if per[n] <= since[n] {
				return false, fmt.Sprintf("%s not reconciled yet", n)
			}
		}
		done := reconciles(t) - metricBase
		return done >= float64(total), fmt.Sprintf("%v of %d reconciles finished", done, total)
	})
}

// grantService annotates Service ns/name to grant routeNS (the
// allowed-route-namespaces annotation, as the Service's owner would).
func grantService(t testing.TB, ns, name, routeNS string) {
	t.Helper()
	must(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var s corev1.Service
		if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &s); err != nil {
			return err
		}
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[sink.AllowedNamespacesAnnotation] = routeNS
		return k8s.Update(context.Background(), &s)
	}))
}
