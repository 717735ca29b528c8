package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// Benchmark shape: 100 routes × 10 endpoints = 1000 endpoints; routes share
// 10 output ConfigMaps (10 routes each, like one openresty ConfigMap per
// gateway group). Bench routes have no monitor/cart: one key per route.
const (
	benchRoutes     = 100
	benchEndpoints  = 10
	benchConfigMaps = 10
)

type stamped[T any] struct {
	obj T
	at  time.Time
}

// benchEnv is set up once per process: creating 100 routes and their
// objects takes longer than the measurement, and the benchmark function
// runs several times (b.N ramp, -count).
type benchEnv struct {
	ns      string
	h       *harness
	base    float64 // reconcile counter before the manager started
	slices  chan stamped[*discoveryv1.EndpointSlice]
	cms     chan stamped[*corev1.ConfigMap]
	changes int // global change sequence: every update has a new IP
	all     []types.NamespacedName
}

var (
	benchOnce sync.Once
	bench     *benchEnv
)

func benchIP(r, e int) string { return fmt.Sprintf("10.20.%d.%d", r, e+1) }

// changedIP is unique per change, so no update is ever a no-op.
func changedIP(seq int) string {
	return fmt.Sprintf("10.%d.%d.%d", 100+(seq/65536)%100, (seq/256)%256, seq%256)
}

func setupBench(b *testing.B) *benchEnv {
	benchOnce.Do(func() {
		ctx := context.Background()
		e := &benchEnv{ns: namespace(b, "bench")}
		e.base = reconciles(b)
		e.h = newHarness(b, e.ns)
		for c := range benchConfigMaps {
			configMap(b, e.ns, fmt.Sprintf("routes-%d", c), map[string]string{"base.conf": "# consumer's own"}, nil)
		}
		for r := range benchRoutes {
			name := fmt.Sprintf("m%03d", r)
			var eps []backend
			for x := range benchEndpoints {
				eps = append(eps, backend{ip: benchIP(r, x), ready: true})
			}
			service(b, e.ns, name, 8000)
			endpointSlice(b, e.ns, name+"-a", name, v4, 8000, eps)
			createRoute(b, newRoute(e.ns, name, name, func(rt *v1alpha1.ModelRoute) {
				rt.Spec.Nginx.OutputConfigMap = fmt.Sprintf("routes-%d", r%benchConfigMaps)
			}))
			e.all = append(e.all, types.NamespacedName{Namespace: e.ns, Name: name})
		}
		for r := range benchRoutes {
			waitKey(b, e.ns, fmt.Sprintf("routes-%d", r%benchConfigMaps), routeKey(fmt.Sprintf("m%03d", r)), []string{host(benchIP(r, benchEndpoints-1))}, nil)
		}
		cs := kubernetes.NewForConfigOrDie(testCfg)
		sw, err := cs.DiscoveryV1().EndpointSlices(e.ns).Watch(ctx, metav1.ListOptions{})
		must(b, err)
		cw, err := cs.CoreV1().ConfigMaps(e.ns).Watch(ctx, metav1.ListOptions{})
		must(b, err)
		e.slices = make(chan stamped[*discoveryv1.EndpointSlice], 4096)
		e.cms = make(chan stamped[*corev1.ConfigMap], 4096)
		go pump(sw, e.slices)
		go pump(cw, e.cms)
		bench = e
	})
	if bench == nil {
		b.Fatal("benchmark setup failed earlier")
	}
	return bench
}

// BenchmarkConvergence measures, per EndpointSlice update, the time until
// (a) a raw client-go watch on EndpointSlices sees the update and (b) a raw
// watch on ConfigMaps sees the route's key holding the new endpoint. The
// ratio of the two is the controller's overhead; ConfigMap writes are
// counted per change and for a no-op resync of every slice. Each change
// alternates with one through a minimal relay (relay-p50/p99-ms): the
// floor a watch-then-write controller can reach here.
//
//	go test ./internal/controller/ -run '^$' -bench Convergence -benchtime 200x -count 5
func BenchmarkConvergence(b *testing.B) {
	ctx := context.Background()
	e := setupBench(b)
	waitQuiet(b, e.h, e.base, nil, e.all...)
	rl := startRelay(b, e)
	var raw, conv, over, relay []time.Duration
	writes0 := e.h.c.cmWrites.Load()
	b.ResetTimer()
	for i := range b.N {
		r := i % benchRoutes
		name := fmt.Sprintf("m%03d", r)
		e.changes++
		ip := changedIP(e.changes)
		want := host(ip)
		var s discoveryv1.EndpointSlice
		must(b, k8s.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: name + "-a"}, &s))
		// Replace the last endpoint: a rollout restarting one pod.
		s.Endpoints[len(s.Endpoints)-1].Addresses = []string{ip}
		t0 := time.Now()
		must(b, k8s.Update(ctx, &s))
		rv := s.ResourceVersion

		deadline := time.After(30 * time.Second)
		var tRaw, tConv time.Time
		for tRaw.IsZero() || tConv.IsZero() {
			select {
			case ev := <-e.slices:
				if ev.obj.Name == s.Name && ev.obj.ResourceVersion == rv {
					tRaw = ev.at
				}
			case ev := <-e.cms:
				if strings.Contains(ev.obj.Data[routeKey(name)], want) {
					tConv = ev.at
				}
			case <-deadline:
				b.Fatalf("change %d (%s) not observed: raw=%v converged=%v", i, name, !tRaw.IsZero(), !tConv.IsZero())
			}
		}
		raw = append(raw, tRaw.Sub(t0))
		conv = append(conv, tConv.Sub(t0))
		over = append(over, tConv.Sub(tRaw))
		relay = append(relay, rl.change(b, e))
	}
	b.StopTimer()

	// Let in-flight reconciles finish before counting writes.
	waitQuiet(b, e.h, e.base, nil, e.all...)
	changeWrites := e.h.c.cmWrites.Load() - writes0

	// No-op resync: every slice touched (an annotation), every route
	// re-rendered, nothing written.
	since, _ := e.h.c.started()
	writes1 := e.h.c.cmWrites.Load()
	for r := range benchRoutes {
		var s discoveryv1.EndpointSlice
		must(b, k8s.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: fmt.Sprintf("m%03d-a", r)}, &s))
		s.Annotations = map[string]string{"resync": fmt.Sprint(time.Now().UnixNano())}
		must(b, k8s.Update(ctx, &s))
	}
	waitQuiet(b, e.h, e.base, since, e.all...)
	noop := e.h.c.cmWrites.Load() - writes1
	drain(e)

	p := testbin.PercentileMs
	b.ReportMetric(p(conv, 0.50), "p50-ms")
	b.ReportMetric(p(conv, 0.99), "p99-ms")
	b.ReportMetric(p(raw, 0.50), "watch-p50-ms")
	b.ReportMetric(p(raw, 0.99), "watch-p99-ms")
	b.ReportMetric(p(conv, 0.50)/p(raw, 0.50), "p50-ratio")
	b.ReportMetric(p(conv, 0.99)/p(raw, 0.99), "p99-ratio")
	b.ReportMetric(p(over, 0.50), "overhead-p50-ms")
	b.ReportMetric(p(relay, 0.50), "relay-p50-ms")
	b.ReportMetric(p(relay, 0.99), "relay-p99-ms")
	b.ReportMetric(p(conv, 0.99)/p(relay, 0.99), "p99-over-relay")
	b.ReportMetric(float64(changeWrites)/float64(b.N), "writes/change")
	b.ReportMetric(float64(noop), "noop-writes")
}

// relay is the floor of any watch-then-write controller on this
// apiserver: a minimal relay (a raw EndpointSlice watch; on each event one
// merge patch of a ConfigMap key, no cache, no queue, no render), observed
// by the same two raw watches as the controller. Its changes alternate
// with the controller's, so both meet the same conditions; its slice and
// ConfigMap are referenced by no route, so the controller's handlers map
// its events to nothing.
type relay struct {
	ns, name string
}

func startRelay(b *testing.B, e *benchEnv) *relay {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	cs := kubernetes.NewForConfigOrDie(testCfg)
	r := &relay{ns: e.ns, name: "relay-floor"}
	if _, err := cs.CoreV1().ConfigMaps(e.ns).Get(ctx, r.name, metav1.GetOptions{}); err != nil {
		configMap(b, e.ns, r.name, map[string]string{"relay": ""}, nil)
		endpointSlice(b, e.ns, r.name, r.name, v4, 8000, up("10.30.0.1"))
	}
	w, err := cs.DiscoveryV1().EndpointSlices(e.ns).Watch(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + r.name})
	must(b, err)
	b.Cleanup(w.Stop)
	go func() {
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok || len(s.Endpoints) == 0 {
				continue
			}
			patch := fmt.Appendf(nil, `{"data":{"relay":%q}}`, host(s.Endpoints[0].Addresses[0]))
			if _, err := cs.CoreV1().ConfigMaps(e.ns).Patch(ctx, r.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && ctx.Err() == nil {
				b.Error(err)
			}
		}
	}()
	drain(e)
	return r
}

// change updates the relay's slice and returns the time until the raw
// ConfigMap watch sees the relayed content.
func (r *relay) change(b *testing.B, e *benchEnv) time.Duration {
	ctx := context.Background()
	e.changes++
	ip := changedIP(e.changes)
	var s discoveryv1.EndpointSlice
	must(b, k8s.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: r.name}, &s))
	s.Endpoints[0].Addresses = []string{ip}
	t0 := time.Now()
	must(b, k8s.Update(ctx, &s))
	deadline := time.After(30 * time.Second)
	for {
		select {
		case <-e.slices:
		case ev := <-e.cms:
			if ev.obj.Name == r.name && ev.obj.Data["relay"] == host(ip) {
				return ev.at.Sub(t0)
			}
		case <-deadline:
			b.Fatalf("relay change %s not observed", ip)
		}
	}
}

// drain drops the resync's watch events so the next run starts clean.
func drain(e *benchEnv) {
	for {
		select {
		case <-e.slices:
		case <-e.cms:
		case <-time.After(200 * time.Millisecond):
			return
		}
	}
}

func pump[T any](w watch.Interface, ch chan<- stamped[T]) {
	for ev := range w.ResultChan() {
		if o, ok := ev.Object.(T); ok {
			ch <- stamped[T]{obj: o, at: time.Now()}
		}
	}
}
