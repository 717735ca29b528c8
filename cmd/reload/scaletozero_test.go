package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/controller"
	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// fakeWorkload plays the Deployment controller and the kubelet for one
// Deployment: while its spec.replicas is above 0 a backend runs (started
// once release allows it) and Service svc's EndpointSlice names it; at 0
// the backend stops and the slice is empty.
type fakeWorkload struct {
	k8s     client.Client
	ns, svc string
	ip      string

	mu      sync.Mutex
	release chan struct{} // closed: a pod starts at once (else it waits)
	wokeAt  []time.Time   // each time replicas went from 0 to more
	sleptAt []time.Time   // each time replicas went to 0
	upAt    []time.Time   // each time the slice named a backend
	stop    func()
	hits    atomic.Int64
	// serve starts the model pod on ip (nil: versionBackend, answering
	// every request "qwen-pod").
	serve func(t *testing.T, ip string) (port int32, stop func())
}

func (f *fakeWorkload) run(ctx context.Context, t *testing.T) {
	running := false
	for ctx.Err() == nil {
		var d appsv1.Deployment
		if err := f.k8s.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: f.svc}, &d); err == nil {
			want := d.Spec.Replicas != nil && *d.Spec.Replicas > 0
			f.mu.Lock()
			rel := f.release
			f.mu.Unlock()
			switch {
			case want && !running:
				f.mu.Lock()
				f.wokeAt = append(f.wokeAt, time.Now())
				f.mu.Unlock()
				select {
				case <-rel:
				case <-ctx.Done():
					return
				}
				port, stop := f.backend(t)
				if err := f.slice(ctx, []int32{port}); err != nil {
					t.Errorf("write the backend's EndpointSlice: %v", err)
				}
				f.mu.Lock()
				f.stop, f.upAt = stop, append(f.upAt, time.Now())
				f.mu.Unlock()
				running = true
			case !want && running:
				f.mu.Lock()
				f.sleptAt = append(f.sleptAt, time.Now())
				stop := f.stop
				f.mu.Unlock()
				if err := f.slice(ctx, nil); err != nil {
					t.Errorf("empty the EndpointSlice: %v", err)
				}
				stop()
				running = false
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// backend starts the model pod (serve, or one that answers every
// request "qwen-pod").
func (f *fakeWorkload) backend(t *testing.T) (int32, func()) {
	if f.serve != nil {
		return f.serve(t, f.ip)
	}
	return versionBackend(t, f.ip, "qwen-pod")
}

// slice makes Service svc's one EndpointSlice name ports on f.ip (none:
// no endpoint).
func (f *fakeWorkload) slice(ctx context.Context, ports []int32) error {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: f.ns, Name: f.svc + "-a", Labels: map[string]string{discoveryv1.LabelServiceName: f.svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8000))}},
	}
	if len(ports) > 0 {
		s.Ports[0].Port = ptr(ports[0])
		s.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{f.ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}}
	}
	var cur discoveryv1.EndpointSlice
	if err := f.k8s.Get(ctx, client.ObjectKeyFromObject(s), &cur); err == nil {
		s.ResourceVersion = cur.ResourceVersion
		return f.k8s.Update(ctx, s)
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	return f.k8s.Create(ctx, s)
}

func (f *fakeWorkload) times() (woke, slept, up []time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.wokeAt), slices.Clone(f.sleptAt), slices.Clone(f.upAt)
}

// TestScaleToZeroEndToEnd is the whole loop on a real API server, the
// real controller, the real reload sidecar in API mode and the shipped
// data plane (nginx.conf + the lua engine), the test playing the
// Deployment controller and the kubelet (fakeWorkload):
//
//   - at zero the route is Ready with reason ScaledToZero and its engine
//     holds an empty table; a route without spec.scaleToZero at zero is
//     NoBackends and nothing of it is written;
//   - requests sent at zero are held, the workload is woken within 2 s of
//     the first, and every held request is answered 200 by the new pod
//     within 1 s of the engine taking its endpoint;
//   - idleAfter scales the workload back to 0 after that long and one
//     --demand-granularity at most, and not before;
//   - a hold that outlasts holdTimeout is a 503 with Retry-After at
//     holdTimeout, and the route holds again afterwards;
//   - beside an HPA on the workload idleAfter is refused (condition
//     ScaleToZero IdleAfterRefused naming it) and not applied.
func TestScaleToZeroEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an API server and nginx")
	}
	const (
		hold = 4 * time.Second
		idle = 10 * time.Second
		step = time.Second // --demand-granularity
	)
	ns := appliedNS
	routes := []*v1alpha1.ModelRoute{
		{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen"},
			Spec: v1alpha1.Spec{
				Discovery:   v1alpha1.Discovery{Service: "qwen"},
				Nginx:       v1alpha1.Nginx{OutputConfigMap: "routes", Service: "openresty", Peers: []v1alpha1.Peer{{Use: v1alpha1.UseBackend, Priority: 2}}},
				ScaleToZero: &v1alpha1.ScaleToZero{Target: v1alpha1.ScaleTarget{Kind: "Deployment", Name: "qwen"}, HoldTimeout: "4s", IdleAfter: "10s"},
			},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"},
			Spec: v1alpha1.Spec{
				Discovery: v1alpha1.Discovery{Service: "plain"},
				Nginx:     v1alpha1.Nginx{OutputConfigMap: "routes", Service: "openresty", Peers: []v1alpha1.Peer{{Use: v1alpha1.UseBackend, Priority: 2}}},
			},
		},
	}
	e := startAppliedEnvOpts(t, appliedOpts{debounce: "100ms", dynamic: true, noBackends: true, routes: routes, qwenSelector: map[string]string{"app": "qwen"},
		sidecarArgs: []string{"--demand-interval", "100ms", "--demand-granularity", step.String()}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k8s := e.k8s
	testbin.Must(t, k8s.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 8000, TargetPort: intstr.FromInt32(8000)}}}}))
	labels := map[string]string{"app": "qwen"}
	testbin.Must(t, k8s.Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen"}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr(int32(0)), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}}},
	}}))
	w := &fakeWorkload{k8s: k8s, ns: ns, svc: "qwen", ip: hostIP(t), release: make(chan struct{})}
	close(w.release)
	wctx, wcancel := context.WithCancel(ctx)
	wdone := make(chan struct{})
	go func() { defer close(wdone); w.run(wctx, t) }()
	t.Cleanup(func() { wcancel(); <-wdone })

	route := func(name string) *v1alpha1.ModelRoute {
		var rt v1alpha1.ModelRoute
		testbin.Must(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &rt))
		return &rt
	}
	cm := func() map[string]string {
		var c corev1.ConfigMap
		testbin.Must(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "routes"}, &c))
		return c.Data
	}
	ctl := control(e.n0)
	// enginePeers is the number of peers the engine holds for qwen (-1:
	// no table), from GET /peers/qwen on its control socket.
	enginePeers := func() int {
		resp, err := ctl.Get("http://engine/peers/qwen")
		if err != nil {
			return -1
		}
		defer resp.Body.Close()
		var a struct {
			Peers *int `json:"peers"`
		}
		if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&a) != nil || a.Peers == nil {
			return -1
		}
		return *a.Peers
	}
	atZero := func(what string) {
		t.Helper()
		testbin.WaitFor(t, wait, what, func() bool {
			r := meta.FindStatusCondition(route("qwen").Status.Conditions, controller.TypeReady)
			tab, err := peers.Parse([]byte(cm()[peers.Key("qwen")]))
			return r != nil && r.Status == metav1.ConditionTrue && r.Reason == compiler.ReasonScaledToZero && err == nil && len(tab.Tiers) == 0 && enginePeers() == 0
		})
	}
	atZero("qwen Ready with reason ScaledToZero, its engine holding an empty table")
	testbin.WaitFor(t, wait, "plain NoBackends", func() bool {
		r := meta.FindStatusCondition(route("plain").Status.Conditions, controller.TypeReady)
		return r != nil && r.Status == metav1.ConditionFalse && r.Reason == controller.ReasonNoBackends
	})
	for k := range cm() {
		if strings.Contains(k, "plain") {
			t.Fatalf("key %s written for a route at zero without scaleToZero", k)
		}
	}

	// Requests at zero: held, the model woken, all answered by the pod.
	servedAt := make(chan time.Time, 1)
	go func() {
		for ctx.Err() == nil {
			if enginePeers() > 0 {
				servedAt <- time.Now()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	const n = 5
	answers := make([]nginxtest.Reply, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); answers[i] = nginxtest.PostChat(e.n0.URL("qwen")) }()
	}
	wg.Wait()
	var served time.Time
	select {
	case served = <-servedAt:
	case <-time.After(wait):
		woke, _, up := w.times()
		var d appsv1.Deployment
		_ = k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "qwen"}, &d)
		var pod corev1.Pod
		_ = k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "openresty-0"}, &pod)
		t.Fatalf("the engine never took the woken pod's endpoint: answers %+v, woken %v, up %v, replicas %v, route status %+v, pod annotations %v",
			answers, woke, up, d.Spec.Replicas, route("qwen").Status.Conditions, pod.Annotations)
	}
	woke, _, up := w.times()
	if len(woke) != 1 || len(up) != 1 {
		t.Fatalf("woken %d times, pods up %d times; want 1 and 1", len(woke), len(up))
	}
	wake := woke[0].Sub(t0)
	t.Logf("wake: %v after the first held request; pod endpoint written %v later, taken by the engine %v after that", wake.Round(time.Millisecond), up[0].Sub(woke[0]).Round(time.Millisecond), served.Sub(up[0]).Round(time.Millisecond))
	if wake > 2*time.Second {
		t.Errorf("woken %v after the first held request, want ≤ 2s", wake)
	}
	var lat []time.Duration
	for i, a := range answers {
		if a.Err != nil || a.Code != 200 || a.Body != "qwen-pod" {
			t.Errorf("held request %d: %d %q %v, want 200 from the woken pod", i, a.Code, a.Body, a.Err)
			continue
		}
		d := a.Done.Sub(served)
		lat = append(lat, d)
		if d > time.Second {
			t.Errorf("held request %d answered %v after the engine took the endpoint, want ≤ 1s", i, d)
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("hold-to-serve after the endpoint was taken: %v", lat)
	if !hasEvent(ctx, t, k8s, ns, "qwen", "Woken") {
		t.Error("no Woken event on the route")
	}

	// idleAfter: back to 0 after idle (+ one step at most), not before.
	last := t0
	for _, a := range answers {
		if a.Sent.After(last) {
			last = a.Sent
		}
	}
	testbin.WaitFor(t, idle+30*time.Second, "the workload scaled back to 0", func() bool {
		_, slept, _ := w.times()
		return len(slept) == 1
	})
	_, slept, _ := w.times()
	after := slept[0].Sub(last)
	t.Logf("scaled to 0 %v after the last request (idleAfter %v, step %v)", after.Round(time.Millisecond), idle, step)
	if after < idle {
		t.Errorf("scaled to 0 %v after the last request, before idleAfter %v", after, idle)
	}
	if after > idle+step+3*time.Second {
		t.Errorf("scaled to 0 %v after the last request, want within idleAfter %v + step %v (+3s)", after, idle, step)
	}
	if !hasEvent(ctx, t, k8s, ns, "qwen", "ScaledToZero") {
		t.Error("no ScaledToZero event on the route")
	}
	atZero("qwen at zero again")

	// A hold longer than holdTimeout: the pod takes longer than the hold
	// (release waits), a 503 with Retry-After at holdTimeout; a request
	// sent after it is held again and served once the pod is up.
	w.mu.Lock()
	w.release = make(chan struct{})
	rel := w.release
	w.mu.Unlock()
	late := nginxtest.PostChat(e.n0.URL("qwen"))
	took := late.Done.Sub(late.Sent)
	if late.Err != nil || late.Code != 503 || late.RetryAfter == "" {
		t.Errorf("a hold past holdTimeout: %d Retry-After %q %v, want 503 with Retry-After", late.Code, late.RetryAfter, late.Err)
	}
	if took < hold || took > hold+1500*time.Millisecond {
		t.Errorf("the timed-out hold was answered after %v, want %v (+1.5s at most)", took, hold)
	}
	again := make(chan nginxtest.Reply, 1)
	go func() { again <- nginxtest.PostChat(e.n0.URL("qwen")) }()
	time.Sleep(500 * time.Millisecond)
	close(rel)
	a := <-again
	if a.Err != nil || a.Code != 200 || a.Body != "qwen-pod" {
		t.Errorf("the request after a timed-out hold: %d %q %v, want held and answered 200 by the pod", a.Code, a.Body, a.Err)
	}

	// Another autoscaler on the workload: idleAfter is refused (the
	// condition names it) and the workload stays up past idleAfter.
	testbin.Must(t, k8s.Create(ctx, &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen-hpa"}, Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
		ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "qwen"}, MinReplicas: ptr(int32(1)), MaxReplicas: 3,
	}}))
	testbin.Must(t, k8s.Patch(ctx, &v1alpha1.ModelRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen"}},
		client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"test/touch":"1"}}}`))))
	testbin.WaitFor(t, wait, "ScaleToZero False IdleAfterRefused naming the HPA", func() bool {
		c := meta.FindStatusCondition(route("qwen").Status.Conditions, controller.TypeScaleToZero)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == controller.ReasonIdleAfterRefused && strings.Contains(c.Message, "HorizontalPodAutoscaler/qwen-hpa")
	})
	time.Sleep(idle + step + 3*time.Second)
	if _, slept, _ := w.times(); len(slept) != 1 {
		t.Errorf("scaled to 0 beside an HPA (%d times in all), want idleAfter refused", len(slept))
	}
}

// hasEvent reports an event with reason on route name.
func hasEvent(ctx context.Context, t *testing.T, k8s client.Client, ns, name, reason string) bool {
	t.Helper()
	ok := false
	testbin.WaitFor(t, 10*time.Second, fmt.Sprintf("event %s on %s", reason, name), func() bool {
		var l eventsv1.EventList
		if err := k8s.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return false
		}
		for _, ev := range l.Items {
			if ev.Regarding.Name == name && ev.Reason == reason {
				ok = true
			}
		}
		return ok
	})
	return ok
}
