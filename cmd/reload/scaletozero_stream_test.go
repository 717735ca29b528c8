package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/controller"
	"github.com/modelsphere/autoconfig/internal/llmsim"
	servedpkg "github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TestScaleToZeroNeverCutsAStream is scale to zero with answers longer
// than idleAfter, on a real API server, the real controller, the real
// reload sidecar in API mode and the shipped data plane, the model pod a
// simulated vLLM streaming 100 tokens/s (the test plays the Deployment
// controller and the kubelet: fakeWorkload; a pod that stops closes its
// streams after 1 s, as a pod's termination would):
//
//   - a stream of 15 s, longer than idleAfter (10 s) and the sidecar's
//     step (1 s), sent at zero, wakes the workload and is answered in full;
//     the workload stays up until it ends, and goes to 0 within idleAfter
//   - one step (+3 s) after its end, not before idleAfter;
//   - a consumer pod whose sidecar stops reporting (SIGSTOP) while a
//     stream is open does not cause a scale-down, however long after the
//     stream's end; once it reports again, the workload goes to 0.
func TestScaleToZeroNeverCutsAStream(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an API server and nginx")
	}
	const (
		idle   = 10 * time.Second
		step   = time.Second // --demand-granularity
		tokens = 1500        // 15 s at 100 tokens/s
	)
	ns := appliedNS
	routes := []*v1alpha1.ModelRoute{{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen"},
		Spec: v1alpha1.Spec{
			Discovery:   v1alpha1.Discovery{Service: "qwen"},
			Nginx:       v1alpha1.Nginx{OutputConfigMap: "routes", Service: "openresty", Peers: []v1alpha1.Peer{{Use: v1alpha1.UseBackend, Priority: 2}}},
			ScaleToZero: &v1alpha1.ScaleToZero{Target: v1alpha1.ScaleTarget{Kind: "Deployment", Name: "qwen"}, HoldTimeout: "60s", IdleAfter: "10s"},
		},
	}}
	e := startAppliedEnvOpts(t, appliedOpts{debounce: "100ms", dynamic: true, noBackends: true, routes: routes, qwenSelector: map[string]string{"app": "qwen"},
		sidecarArgs: []string{"--demand-interval", "100ms", "--demand-granularity", step.String()}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k8s := e.k8s
	labels := map[string]string{"app": "qwen"}
	testbin.Must(t, k8s.Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen"}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr(int32(0)), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}}},
	}}))
	w := &fakeWorkload{k8s: k8s, ns: ns, svc: "qwen", ip: hostIP(t), release: make(chan struct{}),
		serve: func(t *testing.T, ip string) (int32, func()) {
			pod, err := llmsim.Start(llmsim.Config{Name: "qwen-pod", Addr: net.JoinHostPort(ip, "0"), DecodeTokensPerSecond: 100, ShutdownTimeout: time.Second})
			testbin.Must(t, err)
			t.Cleanup(func() { pod.Close() })
			return int32(pod.Port()), func() { pod.Close() }
		}}
	close(w.release)
	wctx, wcancel := context.WithCancel(ctx)
	wdone := make(chan struct{})
	go func() { defer close(wdone); w.run(wctx, t) }()
	t.Cleanup(func() { wcancel(); <-wdone })

	route := func() *v1alpha1.ModelRoute {
		var rt v1alpha1.ModelRoute
		testbin.Must(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "qwen"}, &rt))
		return &rt
	}
	ctl := control(e.n0)
	atZero := func(what string) {
		t.Helper()
		testbin.WaitFor(t, wait, what, func() bool {
			r := meta.FindStatusCondition(route().Status.Conditions, controller.TypeReady)
			if r == nil || r.Status != metav1.ConditionTrue || r.Reason != compiler.ReasonScaledToZero {
				return false
			}
			resp, err := ctl.Get("http://engine/peers/qwen")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			var a struct {
				Peers *int `json:"peers"`
			}
			return resp.StatusCode == 200 && json.NewDecoder(resp.Body).Decode(&a) == nil && a.Peers != nil && *a.Peers == 0
		})
	}
	atZero("qwen Ready with reason ScaledToZero, its engine holding an empty table")
	stream := func() llmsim.Result {
		return llmsim.Chat(ctx, &http.Client{Timeout: 2 * time.Minute}, e.n0.URL("qwen")+"v1/chat/completions", llmsim.ChatRequest{
			Model: "qwen", Messages: []llmsim.Message{{Role: "user", Content: "write a long answer"}}, MaxTokens: tokens, Stream: true}, nil)
	}
	whole := func(what string, res llmsim.Result) {
		t.Helper()
		if res.Err != nil || res.Status != 200 || res.Tokens != tokens {
			t.Fatalf("%s: status %d, %d of %d tokens, err %v: want the whole answer", what, res.Status, res.Tokens, tokens, res.Err)
		}
		if res.Duration < idle+step {
			t.Fatalf("%s lasted %v, not longer than idleAfter %v + step %v: the test proves nothing", what, res.Duration, idle, step)
		}
	}

	// A stream longer than idleAfter, sent at zero.
	res := stream()
	end := time.Now()
	whole("the long stream", res)
	woke, slept, _ := w.times()
	if len(woke) != 1 || len(slept) != 0 {
		t.Fatalf("during the stream: woken %d times, scaled to 0 %d times; want 1 and 0", len(woke), len(slept))
	}
	testbin.WaitFor(t, idle+30*time.Second, "the workload scaled to 0 after the stream", func() bool {
		_, slept, _ := w.times()
		return len(slept) == 1
	})
	_, slept, _ = w.times()
	after := slept[0].Sub(end)
	t.Logf("a stream of %d tokens lasting %v (first token after %v) was answered in full; the workload went to 0 %v after its end (idleAfter %v, step %v)",
		res.Tokens, res.Duration.Round(time.Millisecond), res.TTFT.Round(time.Millisecond), after.Round(time.Millisecond), idle, step)
	if after < idle {
		t.Errorf("scaled to 0 %v after the stream's end, before idleAfter %v", after, idle)
	}
	if after > idle+step+3*time.Second {
		t.Errorf("scaled to 0 %v after the stream's end, want within idleAfter %v + step %v (+3s)", after, idle, step)
	}

	// The sidecar stops reporting while a stream is open.
	atZero("qwen at zero again, in its engine too")
	got := make(chan llmsim.Result, 1)
	go func() { got <- stream() }()
	testbin.WaitFor(t, wait, "openresty-0's report shows the stream open", func() bool {
		var pod corev1.Pod
		if k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "openresty-0"}, &pod) != nil {
			return false
		}
		rep, err := servedpkg.Parse(pod.Annotations[servedpkg.Annotation])
		return err == nil && rep.Demand["qwen"].Open > 0
	})
	// Wait for the first tokens, so the pod is up, then freeze the sidecar.
	time.Sleep(2 * time.Second)
	testbin.Must(t, e.s0.cmd.Process.Signal(syscall.SIGSTOP))
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			testbin.Must(t, e.s0.cmd.Process.Signal(syscall.SIGCONT))
		}
	}
	t.Cleanup(resume)
	res2 := <-got
	end2 := time.Now()
	if woke, slept, up := w.times(); res2.Err != nil {
		t.Logf("woken %v, slept %v, up %v; stream 2 ended %v after %v; ScaleToZero %+v", woke, slept, up, end2, res2.Duration, meta.FindStatusCondition(route().Status.Conditions, controller.TypeScaleToZero))
	}
	whole("the stream open while the sidecar stopped", res2)
	// Nothing is to happen here: wait past idleAfter + step and well past
	// the report's staleness (DemandStaleSteps steps) after the end.
	time.Sleep(idle + servedpkg.DemandStaleSteps*step + 3*time.Second)
	if _, slept, _ := w.times(); len(slept) != 1 {
		t.Fatalf("scaled to 0 while the sidecar that last reported an open stream was stopped (%d scale-downs in all, want 1)", len(slept))
	}
	c := meta.FindStatusCondition(route().Status.Conditions, controller.TypeScaleToZero)
	if c == nil || c.Reason != controller.ReasonAwake || !strings.Contains(c.Message, "open") {
		t.Errorf("ScaleToZero while a report shows an open stream: %+v, want Awake saying it is kept up", c)
	}
	t.Logf("sidecar stopped during a %v stream: still up %v after its end; %s", res2.Duration.Round(time.Millisecond), time.Since(end2).Round(time.Millisecond), c.Message)
	resume()
	testbin.WaitFor(t, wait, "the workload scaled to 0 once the sidecar reports again", func() bool {
		_, slept, _ := w.times()
		return len(slept) == 2
	})
	atZero("qwen at zero after the sidecar reported the stream's end")
}
