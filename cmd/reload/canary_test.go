package main

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/controller"
	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/internal/reload/reloadtest"
	servedpkg "github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// canaryBuckets is the number of buckets a session key hashes into
// (docs/canary.md): crc32(key) mod canaryBuckets, the canary's band
// starting at bucket 0 and weight × 100 buckets wide.
const canaryBuckets = 10000

func canaryBucket(key string) int { return int(crc32.ChecksumIEEE([]byte(key)) % canaryBuckets) }

// hostIP is an address of this machine that an EndpointSlice may name
// (the API server refuses loopback addresses).
func hostIP(t testing.TB) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.IsGlobalUnicast() && ipn.IP.To4() != nil {
			return ipn.IP.String()
		}
	}
	t.Skip("no non-loopback IPv4 address: EndpointSlices cannot name this machine's backends")
	return ""
}

// versionBackend is a backend pod of one model version listening on the
// machine's address; it answers its version's name.
func versionBackend(t testing.TB, ip, version string) (port int32, stop func()) {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		io.WriteString(w, version+"\n")
	})}
	go srv.Serve(l)
	var once sync.Once
	// A stopping pod's server closes its listener (new connections are
	// refused) and finishes the requests it has accepted.
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
		})
	}
	t.Cleanup(stop)
	return int32(l.Addr().(*net.TCPAddr).Port), stop
}

// setSlices makes Service svc's EndpointSlices name exactly ports on ip,
// one slice per port (each backend listens on its own port), as the
// EndpointSlice controller would.
func setSlices(t testing.TB, k8s client.Client, ns, svc, ip string, ports []int32) {
	t.Helper()
	ctx := context.Background()
	var l discoveryv1.EndpointSliceList
	testbin.Must(t, k8s.List(ctx, &l, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: svc}))
	want := map[string]bool{}
	for _, p := range ports {
		name := svc + "-" + strconv.Itoa(int(p))
		want[name] = true
		applySlice(t, k8s, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(p)}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}},
		})
	}
	for i := range l.Items {
		if !want[l.Items[i].Name] {
			if err := k8s.Delete(ctx, &l.Items[i]); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		}
	}
}

// canaryClient sends chat completions to route qwen through nginx.
type canaryClient struct {
	t   testing.TB
	url string
	c   *http.Client
}

// do sends one request with hdr and returns the version that answered
// (the body) after checking X-Model-Version names the same; a non-2xx or
// a transport error is returned as an error.
func (c *canaryClient) do(hdr map[string]string) (string, error) {
	req, err := http.NewRequest(http.MethodPost, c.url+"v1/chat/completions", strings.NewReader(`{"model":"qwen","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	got := strings.TrimSpace(string(b))
	if h := resp.Header.Get("X-Model-Version"); h != got {
		return "", fmt.Errorf("X-Model-Version %q, but %s answered (headers %v)", h, got, resp.Header)
	}
	return got, nil
}

// sessions sends one turn for each session key "s-0" … and returns the
// version each got.
func (c *canaryClient) sessions(n int) []string {
	c.t.Helper()
	out := make([]string, n)
	c.parallel(n, func(i int) error {
		v, err := c.do(map[string]string{"x-session-id": "s-" + strconv.Itoa(i)})
		out[i] = v
		return err
	})
	return out
}

// parallel runs f(0 … n-1) on 8 goroutines and fails on the first error.
func (c *canaryClient) parallel(n int, f func(i int) error) {
	c.t.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					errs <- fmt.Errorf("request %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	if err := errors.Join(all...); err != nil {
		c.t.Fatal(err)
	}
}

// TestCanaryEndToEnd is issue 30's proof on the shipped data plane
// (deploy/openresty/nginx.conf and router.lua on a real nginx with dynamic
// peers, fed by the real reload sidecar), through the controller on a real
// API server: a weighted split of route qwen between its stable Service
// and a canary Service, chosen per request by the override header, the
// session key, else an exact weighted draw.
func TestCanaryEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an API server and nginx")
	}
	e := startAppliedEnvWith(t, "100ms", true)
	ctx := context.Background()
	ip := hostIP(t)
	key := peers.Key("qwen")
	cm := func() map[string]string {
		var c corev1.ConfigMap
		testbin.Must(t, e.k8s.Get(ctx, client.ObjectKey{Namespace: appliedNS, Name: "routes"}, &c))
		return c.Data
	}
	route := func() *v1alpha1.ModelRoute {
		var rt v1alpha1.ModelRoute
		testbin.Must(t, e.k8s.Get(ctx, client.ObjectKey{Namespace: appliedNS, Name: "qwen"}, &rt))
		return &rt
	}
	patch := func(p string) {
		t.Helper()
		rt := &v1alpha1.ModelRoute{ObjectMeta: metav1.ObjectMeta{Namespace: appliedNS, Name: "qwen"}}
		testbin.Must(t, e.k8s.Patch(ctx, rt, client.RawPatch(types.MergePatchType, []byte(p))))
	}
	// served waits until the route is Ready for its generation and
	// openresty-0 serves both of its current keys (its sidecar's served
	// report: the route file loaded, the peers table pushed), the engine
	// holding that table.
	served := func(what string, ok func(tab peers.Table) bool) {
		t.Helper()
		ctl := control(e.n0)
		start := time.Now()
		// why is what is not there yet: a timeout names it.
		why := func() string {
			rt := route()
			r := meta.FindStatusCondition(rt.Status.Conditions, controller.TypeReady)
			if r == nil || r.Status != metav1.ConditionTrue || r.ObservedGeneration != rt.Generation {
				return fmt.Sprintf("route not Ready for generation %d: %+v", rt.Generation, r)
			}
			d := cm()
			tab, err := peers.Parse([]byte(d[key]))
			if err != nil || !ok(tab) {
				return fmt.Sprintf("ConfigMap key %s not the wanted table yet (err %v):\n%s", key, err, d[key])
			}
			if v := reloadtest.EngineVersion(ctl, "qwen"); v != tab.Version {
				return fmt.Sprintf("the engine holds peers version %q, the ConfigMap %q", v, tab.Version)
			}
			var p corev1.Pod
			testbin.Must(t, e.k8s.Get(ctx, client.ObjectKey{Namespace: appliedNS, Name: "openresty-0"}, &p))
			rep, _ := servedpkg.Parse(p.Annotations[servedpkg.Annotation])
			if rep.Keys[key] != servedpkg.ID([]byte(d[key])) || rep.Keys[appliedKey] != servedpkg.ID([]byte(d[appliedKey])) {
				return fmt.Sprintf("openresty-0's served report does not name the current keys: %s", p.Annotations[servedpkg.Annotation])
			}
			return ""
		}
		// Each poll reads the API server three times: every 20 ms, not
		// faster, on a loaded machine.
		testbin.WaitUntil(t, wait, 20*time.Millisecond, what, why)
		t.Logf("%s: served %s after the change", what, time.Since(start).Round(time.Millisecond))
	}

	// The stable version: two backends behind Service qwen.
	e.backends() // no endpoint on the unreachable 10.1.0.1
	var stablePorts []int32
	for range 2 {
		p, _ := versionBackend(t, ip, "stable")
		stablePorts = append(stablePorts, p)
	}
	setSlices(t, e.k8s, appliedNS, "qwen", ip, stablePorts)
	served("the stable backends", func(tab peers.Table) bool { return tab.Peers() == 2 && tab.Canary == nil })
	before := cm()

	// The canary: two backends behind Service qwen-v2, at 10 %.
	testbin.Must(t, e.k8s.Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: appliedNS, Name: "qwen-v2"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 8000, TargetPort: intstr.FromInt32(8000)}}},
	}))
	var canaryPorts []int32
	var stopCanary []func()
	for range 2 {
		p, stop := versionBackend(t, ip, "canary")
		canaryPorts = append(canaryPorts, p)
		stopCanary = append(stopCanary, stop)
	}
	setSlices(t, e.k8s, appliedNS, "qwen-v2", ip, canaryPorts)
	weight := func(w int) {
		t.Helper()
		patch(fmt.Sprintf(`{"spec":{"canary":{"discovery":{"service":"qwen-v2"},"weight":%d}}}`, w))
		served(fmt.Sprintf("the canary at %d %%", w), func(tab peers.Table) bool {
			return tab.Canary != nil && int(tab.Canary.Weight) == w && canaryPeers(tab) == 2 && tab.Peers() == 4
		})
	}
	weight(10)
	if rt := route(); rt.Status.CanaryBackends != 2 || rt.Status.Backends != 2 {
		t.Fatalf("status backends %d, canaryBackends %d; want 2 and 2", rt.Status.Backends, rt.Status.CanaryBackends)
	}
	c := &canaryClient{t: t, url: e.n0.URL("qwen"), c: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}}

	// The override header reaches the named version.
	for _, v := range []string{"canary", "stable"} {
		c.parallel(50, func(int) error {
			got, err := c.do(map[string]string{"x-model-version": v})
			if err == nil && got != v {
				err = fmt.Errorf("x-model-version %s served by %s", v, got)
			}
			return err
		})
	}

	// 20,000 requests without a key land within ±1 % of 90/10.
	var canaryN atomic.Int64
	const keyless = 20000
	c.parallel(keyless, func(int) error {
		v, err := c.do(nil)
		if v == "canary" {
			canaryN.Add(1)
		}
		return err
	})
	share := float64(canaryN.Load()) / keyless
	t.Logf("keyless: %d of %d on the canary (%.2f %%)", canaryN.Load(), keyless, 100*share)
	if share < 0.09 || share > 0.11 {
		t.Fatalf("keyless requests: %.2f %% on the canary at weight 10, want 10 ± 1 %%", 100*share)
	}

	// 1,000 sessions × 10 turns: no session changes version, and each is
	// on the version its key's bucket says.
	const sessions = 1000
	first := c.sessions(sessions)
	for turn := 1; turn < 10; turn++ {
		got := c.sessions(sessions)
		for i := range got {
			if got[i] != first[i] {
				t.Fatalf("session s-%d: turn %d on %s, turn 1 on %s", i, turn+1, got[i], first[i])
			}
		}
	}
	onCanary := 0
	for i, v := range first {
		want := "stable"
		if canaryBucket("s-"+strconv.Itoa(i)) < 10*100 {
			want = "canary"
			onCanary++
		}
		if v != want {
			t.Fatalf("session s-%d (bucket %d) on %s at weight 10, want %s", i, canaryBucket("s-"+strconv.Itoa(i)), v, want)
		}
	}
	t.Logf("sessions: %d of %d on the canary at weight 10, 0 flips in 10 turns", onCanary, sessions)

	// The ramp 10 → 25 → 50: no session moves back to stable, and exactly
	// the sessions of the added band move to the canary.
	prev, prevW := first, 10
	for _, w := range []int{25, 50} {
		weight(w)
		got := c.sessions(sessions)
		moved := 0
		for i := range got {
			b := canaryBucket("s-" + strconv.Itoa(i))
			inBand := b >= prevW*100 && b < w*100
			switch {
			case prev[i] == "canary" && got[i] != "canary":
				t.Fatalf("ramp %d → %d: session s-%d moved from the canary back to %s", prevW, w, i, got[i])
			case prev[i] == "stable" && got[i] == "canary":
				if !inBand {
					t.Fatalf("ramp %d → %d: session s-%d (bucket %d) moved to the canary, outside the added band", prevW, w, i, b)
				}
				moved++
			case inBand:
				t.Fatalf("ramp %d → %d: session s-%d (bucket %d, in the added band) stayed on %s", prevW, w, i, b, got[i])
			}
		}
		t.Logf("ramp %d → %d: %d sessions moved to the canary, none back", prevW, w, moved)
		prev, prevW = got, w
	}

	// The canary scaled to 0 while requests run: its pods stop (refusing
	// connections), then its endpoints go. No request fails, but for one
	// that a stopping backend had already taken into its listen queue:
	// closing the listener resets it after nginx sent the request, and no
	// proxy retries a POST it has sent (nginx logs each such reset).
	refusedBefore, lostBefore := backendErrors(e.n0.ErrorLog())
	var failed, total atomic.Int64
	stopLoad := make(chan struct{})
	var load sync.WaitGroup
	for g := range 4 {
		load.Add(1)
		go func() {
			defer load.Done()
			for i := 0; ; i++ {
				select {
				case <-stopLoad:
					return
				default:
				}
				if _, err := c.do(map[string]string{"x-session-id": fmt.Sprintf("load-%d-%d", g, i%200)}); err != nil {
					failed.Add(1)
					t.Logf("during the scale to 0: %v", err)
				}
				total.Add(1)
			}
		}()
	}
	for _, stop := range stopCanary {
		stop()
	}
	setSlices(t, e.k8s, appliedNS, "qwen-v2", ip, nil)
	served("the canary without endpoints", func(tab peers.Table) bool {
		return tab.Canary != nil && canaryPeers(tab) == 0 && tab.Peers() == 2
	})
	c.parallel(200, func(i int) error {
		v, err := c.do(map[string]string{"x-session-id": "s-" + strconv.Itoa(i)})
		if err == nil && v != "stable" {
			err = fmt.Errorf("served by %s with the canary at 0 endpoints", v)
		}
		return err
	})
	close(stopLoad)
	load.Wait()
	refused, lost := backendErrors(e.n0.ErrorLog())
	refused, lost = refused-refusedBefore, lost-lostBefore
	t.Logf("canary scaled to 0: %d requests during it, %d failed; nginx logged %d refused connections (each falls through to stable) and %d requests reset by a stopping backend",
		total.Load(), failed.Load(), refused, lost)
	if failed.Load() > int64(lost) {
		t.Fatalf("%d of %d requests failed while the canary scaled to 0, %d of them reset by a stopping backend after nginx had sent them", failed.Load(), total.Load(), lost)
	}
	rt := route()
	if d := meta.FindStatusCondition(rt.Status.Conditions, controller.TypeDegraded); d == nil || d.Status != metav1.ConditionTrue || d.Reason != controller.ReasonCanaryNoBackends {
		t.Fatalf("Degraded = %+v, want True/%s", d, controller.ReasonCanaryNoBackends)
	}

	// Removing spec.canary returns to the single-version output, byte for
	// byte.
	patch(`{"spec":{"canary":null}}`)
	served("one version again", func(tab peers.Table) bool { return tab.Canary == nil })
	after := cm()
	for k, v := range before {
		if after[k] != v {
			t.Fatalf("key %s after removing spec.canary differs from before it:\nbefore:\n%s\nafter:\n%s", k, v, after[k])
		}
	}
	if len(after) != len(before) {
		t.Fatalf("keys before %d, after %d", len(before), len(after))
	}
}

// backendErrors counts, in an nginx error log, the connections to a peer
// that were refused and the requests a peer reset or closed after nginx had
// sent them (a POST is not sent again: it fails with 502).
func backendErrors(log string) (refused, lost int) {
	for _, l := range strings.Split(log, "\n") {
		switch {
		case strings.Contains(l, "(111: Connection refused) while connecting to upstream"):
			refused++
		case strings.Contains(l, "upstream prematurely closed connection"),
			strings.Contains(l, "(104: Connection reset by peer) while reading response header from upstream"),
			strings.Contains(l, "(104: Connection reset by peer) while sending request to upstream"),
			strings.Contains(l, "(32: Broken pipe) while sending request to upstream"):
			lost++
		}
	}
	return refused, lost
}

// canaryPeers counts the canary's peers in a table.
func canaryPeers(tab peers.Table) int {
	n := 0
	for _, tr := range tab.Canary.Tiers {
		n += len(tr.Peers)
	}
	return n
}
