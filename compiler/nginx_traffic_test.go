package compiler

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// Traffic through the reference engine (deploy/openresty/lua/router.lua)
// on a real nginx, for a FailOpen route that lists all three tiers: cart
// (priority 3), backend pod IPs (2), backend Service VIP (1). Backends are
// httptest servers on 127.0.0.1; "dead" is a loopback port nothing listens
// on. Counts are logged (go test -v -run TestNginxTraffic ./compiler).

// threeTierRoute is the FailOpen llm route with cart, backend and
// backend-svc tiers; extra values go to spec.nginx.values.
func threeTierRoute(name string, values map[string]string, backend routespec.Peer) *Route {
	r := llmRoute(name, values, cartTier, backend, svcTier)
	r.Spec.Cart = &routespec.Cart{OutputConfigMap: "cart-conf"}
	return withMode(r, routespec.FailOpen)
}

func deadVIP(t *testing.T) *ServiceVIP {
	return &ServiceVIP{IP: "127.0.0.1", Port: refusingPort(t)}
}

// TestNginxTrafficTiers: the highest usable tier serves; a lower tier
// serves only when every peer above is out.
func TestNginxTrafficTiers(t *testing.T) {
	n := startNginx(t)
	cart := newBackend(t, text("cart"))
	a, b := newBackend(t, text("pod-a")), newBackend(t, text("pod-b"))
	svc := newBackend(t, text("svc"))
	dead := func() Endpoint { return Endpoint{IP: "127.0.0.1", Port: refusingPort(t)} }

	steps := []struct {
		name  string
		snap  Snapshot
		serve map[string]bool // bodies allowed; all must appear
	}{
		{"all up: cart serves", Snapshot{Backends: []Endpoint{a.endpoint(t), b.endpoint(t)}, BackendService: svc.vip(t), CartService: cart.vip(t)},
			map[string]bool{"cart": true}},
		{"cart dead: the backend pods serve", Snapshot{Backends: []Endpoint{a.endpoint(t), b.endpoint(t)}, BackendService: svc.vip(t), CartService: deadVIP(t)},
			map[string]bool{"pod-a": true, "pod-b": true}},
		{"cart dead, one pod refusing: the live pods serve", Snapshot{Backends: []Endpoint{a.endpoint(t), b.endpoint(t), dead()}, BackendService: svc.vip(t), CartService: deadVIP(t)},
			map[string]bool{"pod-a": true, "pod-b": true}},
		{"cart and every pod dead: backend-svc serves", Snapshot{Backends: []Endpoint{dead(), dead()}, BackendService: svc.vip(t), CartService: deadVIP(t)},
			map[string]bool{"svc": true}},
	}
	for i, st := range steps {
		route := fmt.Sprintf("tiers%d", i)
		// Four tries: with the cart and both pods dead, the first
		// requests need cart, pod, pod, svc (values override the FailOpen
		// default of 3).
		install(t, n, threeTierRoute(route, map[string]string{"max_tries": "4"}, backendTier), st.snap)
		fails, bodies := hammer(t, n.URL(route)+"v1/chat", hammerRequests)
		t.Logf("%s: %d/%d client failures, served by %v", st.name, fails, hammerRequests, bodies)
		if fails != 0 {
			t.Errorf("%s: %d/%d client failures, want 0", st.name, fails, hammerRequests)
		}
		for body := range bodies {
			if !st.serve[body] {
				t.Errorf("%s: served by %q (%v), want only %v", st.name, body, bodies, st.serve)
			}
		}
		for body := range st.serve {
			if bodies[body] == 0 {
				t.Errorf("%s: %q served nothing (%v)", st.name, body, bodies)
			}
		}
		dead := map[string]bool{}
		if !st.serve["cart"] {
			dead[fmt.Sprintf("cart 127.0.0.1:%d", st.snap.CartService.Port)] = true
		}
		for _, e := range st.snap.Backends {
			if e.Port != a.endpoint(t).Port && e.Port != b.endpoint(t).Port {
				dead[fmt.Sprintf("backend 127.0.0.1:%d", e.Port)] = true
			}
		}
		deadPods, ejectedPods := 0, 0
		for _, p := range enginePeers(t, n.URL(route)) {
			isDead := dead[p.tier+" "+p.addr]
			switch {
			case !isDead && p.Ejected:
				t.Errorf("%s: live peer %+v ejected", st.name, p)
			case isDead && p.tier == "cart" && !p.Ejected:
				t.Errorf("%s: dead cart %+v not ejected", st.name, p)
			case isDead && p.tier == "backend":
				deadPods++
				if p.Ejected {
					ejectedPods++
				}
			}
		}
		// max_ejection_percent 50: of 2 pods at most 1 is ejected.
		if want := min(deadPods, len(st.snap.Backends)/2); ejectedPods != want {
			t.Errorf("%s: %d of %d dead pods ejected, want %d", st.name, ejectedPods, deadPods, want)
		}
	}
}

// TestNginxTraffic503NotEjected: with the cart dead, a backend pod that
// answers 503 keeps its share of the traffic, every 503 reaches the client
// unretried, and the pod is neither counted as failing nor ejected.
func TestNginxTraffic503NotEjected(t *testing.T) {
	n := startNginx(t)
	busy := newBackend(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "overloaded", 503) })
	ok := newBackend(t, text("ok"))
	svc := newBackend(t, text("svc"))
	install(t, n, threeTierRoute("busy3", nil, backendTier),
		Snapshot{Backends: []Endpoint{busy.endpoint(t), ok.endpoint(t)}, BackendService: svc.vip(t), CartService: deadVIP(t)})
	const total = 150
	fails, bodies := hammer(t, n.URL("busy3")+"v1/chat", total)
	t.Logf("one pod answering 503: %d/%d answered 503 (busy pod hits %d), %v", fails, total, busy.hits.Load(), bodies)
	if int64(fails) != busy.hits.Load() || bodies["ok"] != int(ok.hits.Load()) || fails+bodies["ok"] != total {
		t.Errorf("%d non-200 for %d busy hits, ok %v/%d: want every 503 passed back and none retried", fails, busy.hits.Load(), bodies, ok.hits.Load())
	}
	if busy.hits.Load() < total/4 || svc.hits.Load() != 0 {
		t.Errorf("busy pod got %d of %d requests (want its share: a 503 is not a failure), svc %d (want 0)", busy.hits.Load(), total, svc.hits.Load())
	}
	for _, p := range enginePeers(t, n.URL("busy3")) {
		if p.tier == "backend" && (p.Ejected || p.Fails != 0) {
			t.Errorf("peer %+v: a 503 must not count as a connection failure", p)
		}
	}
}

// TestNginxTrafficConcurrency: least connections within a tier and the
// per-peer max_concurrency limit. Both pods hold a request with ?hold=1
// until released.
func TestNginxTrafficConcurrency(t *testing.T) {
	n := startNginx(t)
	release := make(chan struct{})
	held := make(chan struct{}, 8)
	pod := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("hold") != "" {
				held <- struct{}{}
				<-release
			}
			fmt.Fprint(w, name)
		}
	}
	a, b := newBackend(t, pod("pod-a")), newBackend(t, pod("pod-b"))
	limited := backendTier
	limited.MaxConcurrency = 1
	install(t, n, threeTierRoute("conc", nil, limited),
		Snapshot{Backends: []Endpoint{a.endpoint(t), b.endpoint(t)}, BackendService: deadVIP(t), CartService: deadVIP(t)})
	url := n.URL("conc") + "v1/chat"
	// Until the dead cart is ejected (3 connection failures), requests
	// retry from it to the pods.
	for i := 0; i < 4; i++ {
		if code, body, _ := do(t, nil, "GET", url, nil, ""); code != 200 {
			t.Fatalf("warm-up: %d %q", code, body)
		}
	}
	beforeA, beforeB := a.hits.Load(), b.hits.Load()

	var wg sync.WaitGroup
	defer wg.Wait()
	var once sync.Once
	defer once.Do(func() { close(release) })
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := http.Get(url + "?hold=1"); err == nil {
				resp.Body.Close()
			}
		}()
		<-held
	}
	// Least connections: the second request went to the idle pod.
	if da, db := a.hits.Load()-beforeA, b.hits.Load()-beforeB; da != 1 || db != 1 {
		t.Errorf("two concurrent requests: pod-a %d, pod-b %d, want one each", da, db)
	}
	// Every peer of the serving tier is at its limit: admission refuses
	// (it does not fall through to the lower tier, nor queue).
	code, body, hdr := do(t, nil, "GET", url, nil, "")
	t.Logf("both pods at max_concurrency 1: third request %d %q, Retry-After %q", code, body, hdr.Get("Retry-After"))
	if code != 503 || hdr.Get("Retry-After") != "1" {
		t.Errorf("both pods at max_concurrency 1: got %d %q, want 503 with Retry-After: 1", code, body)
	}
	once.Do(func() { close(release) })
	wg.Wait()
	if code, body, _ := do(t, nil, "GET", url, nil, ""); code != 200 {
		t.Errorf("after release: %d %q", code, body)
	}
	for _, p := range enginePeers(t, n.URL("conc")) {
		if p.Active != 0 {
			t.Errorf("peer %+v: active requests not released", p)
		}
	}
}

// TestNginxTrafficHealthProbe: a pod whose probe path does not answer 200
// leaves the pick within a few probe intervals; the engine option
// health_probe_interval_seconds sets the interval.
func TestNginxTrafficHealthProbe(t *testing.T) {
	n := startNginx(t)
	a := newBackend(t, text("pod-a"))
	var sick sync.Map
	b := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		if _, bad := sick.Load("b"); bad && r.URL.Path == "/healthz" {
			http.Error(w, "sick", 500)
			return
		}
		fmt.Fprint(w, "pod-b")
	})
	probed := backendTier
	probed.ProbePath = "/healthz"
	install(t, n, threeTierRoute("probe", map[string]string{"health_probe_interval_seconds": "1"}, probed),
		Snapshot{Backends: []Endpoint{a.endpoint(t), b.endpoint(t)}, BackendService: deadVIP(t), CartService: deadVIP(t)})
	url := n.URL("probe") + "v1/chat"
	if _, bodies := hammer(t, url, 30); bodies["pod-b"] == 0 {
		t.Fatalf("healthy pod-b served nothing: %v", bodies)
	}
	sick.Store("b", true)
	time.Sleep(2500 * time.Millisecond) // two probe intervals (the engine's least: 1 s)
	fails, bodies := hammer(t, url, 60)
	t.Logf("pod-b's probe answers 500: %d failures, served by %v", fails, bodies)
	if fails != 0 || bodies["pod-b"] != 0 {
		t.Errorf("pod-b failed its probe: served by %v with %d failures, want only pod-a", bodies, fails)
	}
	for _, p := range enginePeers(t, n.URL("probe")) {
		if p.tier == "backend" && p.Port == b.endpoint(t).Port && p.Healthy {
			t.Errorf("peer %+v: want healthy=false", p)
		}
	}
	sick.Delete("b")
	time.Sleep(2500 * time.Millisecond)
	if _, bodies := hammer(t, url, 30); bodies["pod-b"] == 0 {
		t.Errorf("pod-b's probe answers 200 again but it served nothing: %v", bodies)
	}
}

// TestNginxTrafficTPSStatus: GET /<route>/_tps_status answers the route's
// options; opt_in is true exactly when tps_limit_tps is set.
func TestNginxTrafficTPSStatus(t *testing.T) {
	n := startNginx(t)
	pod := newBackend(t, text("pod"))
	snap := Snapshot{Backends: []Endpoint{pod.endpoint(t)}, BackendService: pod.vip(t), CartService: pod.vip(t)}
	install(t, n, threeTierRoute("tps-on", map[string]string{"tps_limit_tps": "30"}, backendTier), snap)
	install(t, n, threeTierRoute("tps-off", nil, backendTier), snap)
	for route, want := range map[string]bool{"tps-on": true, "tps-off": false} {
		code, body := nginxtest.Get(t, n.URL(route)+"_tps_status")
		var st struct {
			Route   string            `json:"route"`
			OptIn   bool              `json:"opt_in"`
			Limit   *float64          `json:"tps_limit_tps"`
			Options map[string]string `json:"options"`
		}
		if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
			t.Fatalf("%s: %d %q %v", route, code, body, err)
		}
		if st.Route != route || st.OptIn != want || st.Options["failure_mode"] != "FailOpen" ||
			(want && (st.Limit == nil || *st.Limit != 30 || st.Options["tps_limit_tps"] != "30")) {
			t.Errorf("%s: %s", route, body)
		}
	}
	if pod.hits.Load() != 0 {
		t.Errorf("_tps_status reached a backend (%d hits)", pod.hits.Load())
	}
}

// TestNginxTrafficIPv6Peer: a peer host is a bare IPv6 address (the
// contract's form, no brackets); the balancer and the health probe reach
// it.
func TestNginxTrafficIPv6Peer(t *testing.T) {
	l, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	var probes atomic.Int64
	v6 := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			probes.Add(1)
		}
		fmt.Fprint(w, "pod-v6")
	}))
	v6.Listener.Close()
	v6.Listener = l
	v6.Start()
	t.Cleanup(v6.Close)
	port := int32(l.Addr().(*net.TCPAddr).Port)
	n := startNginx(t)
	probed := backendTier
	probed.ProbePath = "/healthz"
	install(t, n, threeTierRoute("v6", map[string]string{"health_probe_interval_seconds": "1"}, probed),
		Snapshot{Backends: []Endpoint{{IP: "::1", Port: port, Ready: true}}, BackendService: deadVIP(t), CartService: deadVIP(t)})
	fails, bodies := hammer(t, n.URL("v6")+"v1/chat", 30)
	if fails != 0 || bodies["pod-v6"] != 30 {
		t.Errorf("IPv6 peer: %d failures, %v", fails, bodies)
	}
	time.Sleep(1500 * time.Millisecond) // more than one probe interval (1 s)
	if probes.Load() == 0 {
		t.Errorf("the health probe never reached the IPv6 peer")
	}
	for _, p := range enginePeers(t, n.URL("v6")) {
		if p.Host == "::1" && !p.Healthy {
			t.Errorf("IPv6 peer %+v: want healthy", p)
		}
	}
}

// TestNginxEngineOptionsClamped: engine options are free-form text in the
// route's values; out-of-range numbers cannot break the shared nginx or
// the route's own requests. The probe interval is at least 1 s (0 = off):
// across many routes a 1 ms interval exhausted the workers'
// connections ("1024 worker_connections are not enough"), found by the
// property test at length; a negative ejection ttl was a dict error.
func TestNginxEngineOptionsClamped(t *testing.T) {
	n := startNginx(t)
	var probes atomic.Int64
	pod := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			probes.Add(1)
		}
		fmt.Fprint(w, "pod")
	})
	probed := backendTier
	probed.ProbePath = "/healthz"
	dead := Endpoint{IP: "127.0.0.1", Port: refusingPort(t)}
	install(t, n, threeTierRoute("clamp", map[string]string{
		"health_probe_interval_seconds": "0.001", "ejection_seconds": "-5", "max_ejection_percent": "900",
		"max_tries": "1e308", "eject_consecutive_connect_failures": "-1",
	}, probed), Snapshot{Backends: []Endpoint{pod.endpoint(t), dead}, BackendService: deadVIP(t), CartService: deadVIP(t)})
	before := probes.Load()
	time.Sleep(2 * time.Second)
	// Two workers, one peer probed: at most about 2 probes a second.
	if got := probes.Load() - before; got > 8 {
		t.Errorf("%d probes in 2 s with health_probe_interval_seconds 0.001; want the 1 s floor", got)
	}
	fails, bodies := hammer(t, n.URL("clamp")+"v1/chat", 30)
	if fails != 0 || bodies["pod"] == 0 {
		t.Errorf("%d failures, %v", fails, bodies)
	}
}
