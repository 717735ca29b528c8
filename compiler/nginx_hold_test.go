package compiler

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// holdRoute is a scale-to-zero llm route holding hold (e.g. "2s").
func holdRoute(name, hold string, values map[string]string) *Route {
	return &Route{Name: name, Namespace: "llm", Spec: routespec.Spec{
		ModelType: routespec.ModelTypeLLM,
		Discovery: routespec.Discovery{Service: name},
		Nginx:     routespec.Nginx{OutputConfigMap: "routes", Service: "openresty", Values: values, Peers: []routespec.Peer{{Use: routespec.UseBackend, Priority: 2}}},
		ScaleToZero: &routespec.ScaleToZero{Target: routespec.ScaleTarget{Kind: routespec.KindDeployment, Name: name},
			WakeReplicas: 1, HoldTimeout: hold},
	}}
}

// holdOutputs compiles route for n with snap: the route file and (with
// dynamic) the peers table.
func holdOutputs(t *testing.T, n *nginxtest.Nginx, route *Route, snap Snapshot, dynamic bool) (conf, table []byte) {
	t.Helper()
	res, err := Compile(route, normalized(snap), Options{SockDir: n.SockDir(), DynamicPeers: dynamic})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range res.Outputs {
		b, err := o.Render(nil)
		if err != nil {
			t.Fatal(err)
		}
		switch o.Key {
		case RouteKey(route):
			conf = b
		case PeersKey(route):
			table = b
		}
	}
	return conf, table
}

// demandOf is the engine's GET /demand entry of route.
type demandEntry struct {
	Waiting     int     `json:"waiting"`
	Open        int     `json:"open"`
	LastRequest float64 `json:"last_request"`
	LastEnd     float64 `json:"last_end"`
	HeldTotal   int     `json:"held_total"`
}

func demandOf(t *testing.T, c *http.Client, route string) (demandEntry, bool) {
	t.Helper()
	routes, _ := demandAll(t, c)
	d, ok := routes[route]
	return d, ok
}

// askAll sends n requests at once and returns a channel of their answers.
func askAll(url string, n int) <-chan nginxtest.Reply {
	out := make(chan nginxtest.Reply, n)
	for range n {
		go func() { out <- nginxtest.PostChat(url) }()
	}
	return out
}

// installHold installs route's file at zero endpoints with dynamic peers
// and pushes its empty table (serial 1).
func installHold(t *testing.T, n *nginxtest.Nginx, c *http.Client, route *Route) {
	t.Helper()
	conf, empty := holdOutputs(t, n, route, Snapshot{}, true)
	installDynamic(t, n, RouteName(route), conf)
	tb, err := peers.Parse(empty)
	if err != nil {
		t.Fatal(err)
	}
	push(t, c, tb, empty, 1)
}

// pushPod starts a backend answering "pod" (the woken pod) and pushes
// route's table with it.
func pushPod(t *testing.T, n *nginxtest.Nginx, c *http.Client, route *Route, serial int64) {
	t.Helper()
	be := newBackend(t, text("pod"))
	_, full := holdOutputs(t, n, route, Snapshot{Backends: []Endpoint{be.endpoint(t)}}, true)
	ft, err := peers.Parse(full)
	if err != nil {
		t.Fatal(err)
	}
	push(t, c, ft, full, serial)
}

func waitWaiting(t *testing.T, c *http.Client, route string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, ok := demandOf(t, c, route)
		if ok && d.Waiting == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("route %s: %d requests waiting (reported %v), want %d", route, d.Waiting, ok, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func metricValue(t *testing.T, n *nginxtest.Nginx, series string) string {
	t.Helper()
	resp, err := http.Get(n.MetricsURL())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, series+" "); ok {
			return rest
		}
	}
	return ""
}

// TestNginxHoldDynamic: a scale-to-zero route at zero (the compiled
// route file and its empty table, pushed) holds requests; they wait (the
// demand report and the gauge count them) and are all answered by the
// first peer pushed, within a second of the push's acknowledgement. The
// route's last request and held total are reported.
func TestNginxHoldDynamic(t *testing.T) {
	n := startDynamic(t)
	c := controlClient(n)
	route := holdRoute("zq", "30s", nil)
	installHold(t, n, c, route)
	if d, ok := demandOf(t, c, "zq"); ok {
		t.Fatalf("demand before any request registered the route: %+v", d)
	}

	before := time.Now()
	answers := askAll(n.URL("zq"), 3)
	waitWaiting(t, c, "zq", 3)
	if got := metricValue(t, n, `autoconfig_engine_waiting_requests{route="zq"}`); got != "3" {
		t.Errorf("waiting gauge %q, want 3", got)
	}
	pushPod(t, n, c, route, 2)
	acked := time.Now()
	for range 3 {
		a := <-answers
		if a.Err != nil || a.Code != 200 || a.Body != "pod" {
			t.Fatalf("held request: %d %q %v", a.Code, a.Body, a.Err)
		}
		if d := a.Done.Sub(acked); d > time.Second {
			t.Errorf("a held request was answered %v after the push was acknowledged, want ≤ 1s", d)
		}
		t.Logf("held %v, answered %v after the acknowledgement", a.Done.Sub(a.Sent).Round(time.Millisecond), a.Done.Sub(acked).Round(time.Millisecond))
	}
	d, _ := demandOf(t, c, "zq")
	if d.Waiting != 0 || d.HeldTotal != 3 || d.LastRequest < float64(before.Unix()) {
		t.Errorf("demand after the hold: %+v", d)
	}
	if got := metricValue(t, n, `autoconfig_engine_held_requests_total{route="zq",result="served"}`); got != "3" {
		t.Errorf("held served counter %q, want 3", got)
	}
	if got := metricValue(t, n, `autoconfig_engine_waiting_requests{route="zq"}`); got != "0" {
		t.Errorf("waiting gauge after the hold %q, want 0", got)
	}
	// With a peer, requests are not held.
	if a := nginxtest.PostChat(n.URL("zq")); a.Code != 200 {
		t.Errorf("a request with a peer: %d", a.Code)
	}
	if d, _ := demandOf(t, c, "zq"); d.HeldTotal != 3 {
		t.Errorf("held total %d after a request with a peer, want 3", d.HeldTotal)
	}
}

// TestNginxHoldTimeout: a hold that outlasts hold_timeout is answered 503
// with Retry-After, not before the timeout; the route holds the next
// request again, which a push then serves.
func TestNginxHoldTimeout(t *testing.T) {
	n := startDynamic(t)
	c := controlClient(n)
	route := holdRoute("zt", "2s", nil)
	installHold(t, n, c, route)
	a := nginxtest.PostChat(n.URL("zt"))
	took := a.Done.Sub(a.Sent)
	if a.Code != 503 || a.RetryAfter == "" {
		t.Fatalf("timed-out hold: %d Retry-After %q %q", a.Code, a.RetryAfter, a.Body)
	}
	if took < 2*time.Second || took > 3500*time.Millisecond {
		t.Errorf("timed-out hold answered after %v, want 2s (≤ 3.5s)", took)
	}
	if got := metricValue(t, n, `autoconfig_engine_held_requests_total{route="zt",result="timeout"}`); got != "1" {
		t.Errorf("held timeout counter %q, want 1", got)
	}
	if got := metricValue(t, n, `autoconfig_engine_admission_refusals_total{route="zt",reason="hold_timeout"}`); got != "1" {
		t.Errorf("hold_timeout refusals %q, want 1", got)
	}
	next := askAll(n.URL("zt"), 1)
	waitWaiting(t, c, "zt", 1)
	pushPod(t, n, c, route, 2)
	if a := <-next; a.Code != 200 || a.Body != "pod" {
		t.Errorf("the request after a timed-out hold: %d %q", a.Code, a.Body)
	}
}

// TestNginxHoldMax: with hold_max 2, a third request at zero is refused at
// once (503, Retry-After); the two held are served by the push.
func TestNginxHoldMax(t *testing.T) {
	n := startDynamic(t)
	c := controlClient(n)
	route := holdRoute("zm", "30s", map[string]string{"hold_max": "2"})
	installHold(t, n, c, route)
	held := askAll(n.URL("zm"), 2)
	waitWaiting(t, c, "zm", 2)
	a := nginxtest.PostChat(n.URL("zm"))
	if a.Code != 503 || a.RetryAfter == "" || a.Done.Sub(a.Sent) > time.Second {
		t.Fatalf("the request past hold_max: %d Retry-After %q after %v, want 503 at once", a.Code, a.RetryAfter, a.Done.Sub(a.Sent))
	}
	if got := metricValue(t, n, `autoconfig_engine_held_requests_total{route="zm",result="refused"}`); got != "1" {
		t.Errorf("held refused counter %q, want 1", got)
	}
	pushPod(t, n, c, route, 2)
	for range 2 {
		if a := <-held; a.Code != 200 {
			t.Errorf("held request: %d %q", a.Code, a.Body)
		}
	}
	waitWaiting(t, c, "zm", 0)
}

// TestNginxHoldStaticReload: a static scale-to-zero route at zero (a route
// file without tiers) holds requests; the route file with the woken pod
// and a SIGHUP serve them, though they are held in workers of the old
// configuration, within a second of the new workers.
func TestNginxHoldStaticReload(t *testing.T) {
	n := startDynamic(t)
	c := controlClient(n)
	route := holdRoute("zs", "30s", nil)
	conf, _ := holdOutputs(t, n, route, Snapshot{}, false)
	path := filepath.Join(n.RoutesDir(), RouteKey(route))
	if err := os.WriteFile(path, conf, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	answers := askAll(n.URL("zs"), 3)
	waitWaiting(t, c, "zs", 3)
	be := newBackend(t, text("pod"))
	full, _ := holdOutputs(t, n, route, Snapshot{Backends: []Endpoint{be.endpoint(t)}}, false)
	if err := os.WriteFile(path, full, 0o644); err != nil {
		t.Fatal(err)
	}
	old := n.WorkerPIDs()
	if err := n.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.WaitWorkersChanged(ctx, old); err != nil {
		t.Fatal(err)
	}
	reloaded := time.Now()
	var wg sync.WaitGroup
	for range 3 {
		a := <-answers
		if a.Err != nil || a.Code != 200 || a.Body != "pod" {
			t.Errorf("request held across the reload: %d %q %v", a.Code, a.Body, a.Err)
			continue
		}
		if d := a.Done.Sub(reloaded); d > 1500*time.Millisecond {
			t.Errorf("a held request was answered %v after the new workers started, want ≤ 1.5s", d)
		}
		t.Logf("held %v, answered %v after the new workers started", a.Done.Sub(a.Sent).Round(time.Millisecond), a.Done.Sub(reloaded).Round(time.Millisecond))
	}
	wg.Wait()
	if err := n.WaitWorkersGone(ctx, old); err != nil {
		t.Errorf("old workers stay after their held requests were served: %v", err)
	}
}

// TestNginxNoHoldWithoutScaleToZero: a dynamic route without the hold
// option whose table has no peer answers 503 at once, as before.
func TestNginxNoHoldWithoutScaleToZero(t *testing.T) {
	n := startDynamic(t)
	c := controlClient(n)
	route := holdRoute("zn", "", nil)
	route.Spec.ScaleToZero = nil
	be := newBackend(t, text("pod"))
	conf, _ := holdOutputs(t, n, route, Snapshot{Backends: []Endpoint{be.endpoint(t)}}, true)
	if strings.Contains(string(conf), "hold_timeout") {
		t.Fatal("a route without scaleToZero renders hold_timeout")
	}
	installDynamic(t, n, "zn", conf)
	tb, empty := table(t, "zn")
	push(t, c, tb, empty, 1)
	a := nginxtest.PostChat(n.URL("zn"))
	if a.Code != 503 || a.Done.Sub(a.Sent) > time.Second {
		t.Errorf("no peer without hold: %d after %v, want 503 at once", a.Code, a.Done.Sub(a.Sent))
	}
	if _, ok := demandOf(t, c, "zn"); ok {
		t.Error("a route without hold_timeout is in the demand report")
	}
}
