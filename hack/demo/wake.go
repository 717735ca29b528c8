package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/modelsphere/autoconfig/internal/llmsim"
)

// The scale-to-zero scene: a route whose Deployment is at 0 replicas. A
// request is held by the engine, the controller wakes the Deployment (the
// demo plays the Deployment controller and the kubelet: it starts a
// simulated vLLM pod after a model load time), the request is answered by
// the new pod; with no request for idleAfter the controller scales the
// Deployment back to 0.
const (
	wakeRoute = "sleepy"
	// wakeLoad is the simulated model load time of the woken pod.
	wakeLoad = 2 * time.Second
	wakeIdle = 10 * time.Second
)

const wakeManifest = `apiVersion: routing.modelsphere.dev/v1alpha1
kind: ModelRoute
metadata:
  name: sleepy
  namespace: llm-route
spec:
  discovery:
    service: llm/sleepy
  nginx:
    route: sleepy
    service: llm-route/openresty
    outputConfigMap: llm-route/openresty-conf
    peers:
    - {use: backend, priority: 2}
  scaleToZero:
    target: {kind: Deployment, name: sleepy}
    holdTimeout: 60s
    idleAfter: 10s
`

// wake runs the scene; it needs the nginx data plane (the engine holds).
func (d *demo) wake(ctx context.Context) error {
	d.title("scene: scale to zero and back: a request at zero is held, the model woken and the request answered; idle, it goes back to zero")
	if d.nginx == nil {
		d.say("skipped: the engine holds the requests in nginx, and there is no nginx data plane here (%s)", d.noNginx)
		return nil
	}
	labels := map[string]string{"app": wakeRoute}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: llmBackendNS, Name: wakeRoute}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr(int32(0)), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}},
	}}
	if err := d.c.Create(ctx, dep); err != nil {
		return fmt.Errorf("create Deployment %s/%s: %w", llmBackendNS, wakeRoute, err)
	}
	svc := granted(headless(service(llmBackendNS, wakeRoute, "http", 8000)))
	svc.Spec.Selector = labels // the workload behind the route: the controller scales only that one
	if err := d.c.Create(ctx, svc); err != nil {
		return fmt.Errorf("create Service %s/%s: %w", llmBackendNS, wakeRoute, err)
	}
	d.say("Deployment llm/%s at 0 replicas, Service llm/%s without endpoints", wakeRoute, wakeRoute)
	d.step("kubectl apply -f - <<EOF")
	for _, l := range strings.Split(strings.TrimRight(wakeManifest, "\n"), "\n") {
		d.say("%s", l)
	}
	d.say("EOF")
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(wakeManifest), &u.Object); err != nil {
		return err
	}
	if err := d.c.Create(ctx, u); err != nil {
		return fmt.Errorf("apply route %s: %w", wakeRoute, err)
	}
	if err := d.waitFor(ctx, "route sleepy Ready, reason ScaledToZero", func() (bool, error) {
		row, ok, err := d.route(ctx, wakeRoute)
		return ok && row.ready == "True" && row.reason == "ScaledToZero" && row.synced == "1/1", err
	}); err != nil {
		return err
	}
	if err := d.table(ctx); err != nil {
		return err
	}
	d.say("zero endpoints is a state here, not a failure: the route is written without peers and its engine holds requests")

	w := &wakeWorkload{d: d}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); w.run(wctx) }()
	defer func() { cancel(); wg.Wait(); w.stop() }()

	d.step("curl " + d.nginx.URL(wakeRoute) + "v1/chat/completions  # at zero replicas")
	start := time.Now()
	code, body, err := wakeAsk(ctx, d.nginx.URL(wakeRoute)+"v1/chat/completions")
	took := time.Since(start)
	if err != nil || code != http.StatusOK {
		return fmt.Errorf("the request at zero: %d %s %v (the Deployment controller and kubelet: %s)", code, body, err, w.story())
	}
	woke, up := w.times()
	d.say("woken %s after the request (the controller set deployments/%s/scale to 1; event Woken on the route)", ms(woke.Sub(start)), wakeRoute)
	d.say("the pod loaded the model in %s and its endpoint was written %s after the request", wakeLoad, ms(up.Sub(start)))
	d.say("the held request was answered 200 after %s (%s after the endpoint), by %s", ms(took), ms(start.Add(took).Sub(up)), strings.TrimSpace(body))

	if err := d.waitFor(ctx, "the Deployment back at 0 replicas after idleAfter", func() (bool, error) {
		return w.slept(), nil
	}); err != nil {
		return err
	}
	d.say("no request since that one: scaled back to 0 %s after its answer ended (idleAfter %s from the end of the last request, + the sidecar's 2 s step at most; event ScaledToZero)", ms(w.sleptAt().Sub(start.Add(took))), wakeIdle)
	if err := d.waitFor(ctx, "route sleepy at zero again", func() (bool, error) {
		row, ok, err := d.route(ctx, wakeRoute)
		return ok && row.reason == "ScaledToZero" && row.backendsN == 0, err
	}); err != nil {
		return err
	}
	if err := d.table(ctx); err != nil {
		return err
	}
	return d.deleteWakeRoute(ctx)
}

// wakeAsk sends one chat completion and returns its status and the pod
// that answered (the body, when it is not a 200).
func wakeAsk(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"model":"sleepy","messages":[{"role":"user","content":"wake up"}],"max_tokens":8}`))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, string(b), nil
	}
	return resp.StatusCode, "pod " + resp.Header.Get("X-Sim-Pod"), nil
}

// wakeWorkload plays the Deployment controller and the kubelet for
// Deployment llm/sleepy: replicas above 0 start a simulated vLLM pod
// after wakeLoad and write its endpoint; 0 stops it and empties them.
type wakeWorkload struct {
	d *demo

	mu                  sync.Mutex
	pod                 *llmsim.Pod
	wokeAt, upAt, sleep time.Time
	log                 []string
}

func (w *wakeWorkload) run(ctx context.Context) {
	for ctx.Err() == nil {
		var dep appsv1.Deployment
		if err := w.d.c.Get(ctx, client.ObjectKey{Namespace: llmBackendNS, Name: wakeRoute}, &dep); err == nil {
			want := dep.Spec.Replicas != nil && *dep.Spec.Replicas > 0
			w.mu.Lock()
			running := w.pod != nil
			w.mu.Unlock()
			switch {
			case want && !running:
				w.note("replicas %d: starting a pod (model load %s)", *dep.Spec.Replicas, wakeLoad)
				w.mu.Lock()
				w.wokeAt = time.Now()
				w.mu.Unlock()
				select {
				case <-ctx.Done():
					return
				case <-time.After(wakeLoad):
				}
				p, err := llmsim.Start(llmsim.Config{Name: wakeRoute + "-0", Model: wakeRoute, Addr: net.JoinHostPort(w.d.host.String(), "0"), DecodeTokensPerSecond: 100})
				if err != nil {
					w.note("start the pod: %v", err)
					continue
				}
				if err := w.d.setEndpoints(ctx, llmBackendNS, wakeRoute, "http", []endpoint{{ip: w.d.host.String(), port: int32(p.Port()), node: "gpu-a"}}); err != nil {
					w.note("write the endpoint: %v", err)
				}
				w.mu.Lock()
				w.pod, w.upAt = p, time.Now()
				w.mu.Unlock()
			case !want && running:
				w.note("replicas 0: stopping the pod")
				if err := w.d.setEndpoints(ctx, llmBackendNS, wakeRoute, "http", nil); err != nil {
					w.note("empty the endpoints: %v", err)
				}
				w.mu.Lock()
				w.pod.Close()
				w.pod, w.sleep = nil, time.Now()
				w.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (w *wakeWorkload) note(format string, args ...any) {
	w.mu.Lock()
	w.log = append(w.log, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
	w.mu.Unlock()
}

func (w *wakeWorkload) story() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.log, "; ")
}

func (w *wakeWorkload) times() (woke, up time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wokeAt, w.upAt
}

func (w *wakeWorkload) slept() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.sleep.IsZero()
}

func (w *wakeWorkload) sleptAt() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sleep
}

func (w *wakeWorkload) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pod != nil {
		w.pod.Close()
		w.pod = nil
	}
}

// deleteWakeRoute deletes the route, then the Deployment and the Service.
func (d *demo) deleteWakeRoute(ctx context.Context) error {
	d.step("kubectl -n " + routeNS + " delete mr " + wakeRoute + "; kubectl -n " + llmBackendNS + " delete deploy,svc " + wakeRoute + "  # clean up")
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(modelRouteGVK)
	u.SetNamespace(routeNS)
	u.SetName(wakeRoute)
	if err := d.c.Delete(ctx, u); client.IgnoreNotFound(err) != nil {
		return err
	}
	if err := d.waitFor(ctx, "route sleepy gone", func() (bool, error) {
		err := d.c.Get(ctx, client.ObjectKey{Namespace: routeNS, Name: wakeRoute}, u)
		return err != nil, client.IgnoreNotFound(err)
	}); err != nil {
		return err
	}
	for _, o := range []client.Object{
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: llmBackendNS, Name: wakeRoute}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: llmBackendNS, Name: wakeRoute}},
	} {
		if err := d.c.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	d.say("route sleepy, Deployment and Service llm/sleepy deleted")
	return nil
}
