package compiler

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// The real-nginx tests of docs/failure-modes.md: the video route (stock
// nginx upstream) and the llm route through the reference engine of
// deploy/openresty/lua/router.lua, which implements the lua contract's
// failure-mode options. Counts are logged (go test -v -run 'FailOpen|FailMode') and are
// the figures quoted in the docs.

// hammerRequests is the size of every burst (the seed design's 150).
const hammerRequests = 150

// hammer sends n POST requests from 3 concurrent clients and returns the
// number of client failures (transport error or status other than 200)
// and the bodies of the successes.
func hammer(t *testing.T, url string, n int) (fails int, bodies map[string]int) {
	t.Helper()
	var mu sync.Mutex
	bodies = map[string]int{}
	jobs := make(chan int)
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				// POST, as chat completions are: a refused connection sent
				// nothing, so nginx may retry it. Each request is its own
				// conversation (its own prompt): the engine keeps a repeated
				// prompt on one pod (session affinity), and these bursts
				// test the tiers, not placement.
				body := fmt.Sprintf(`{"model":"m","prompt":"request %d"}`, i)
				resp, err := client.Post(url, "application/json", strings.NewReader(body))
				ok, body, why := false, "", ""
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					ok, body = resp.StatusCode == 200, string(b)
					why = fmt.Sprintf("%d %q", resp.StatusCode, b)
				} else {
					why = err.Error()
				}
				mu.Lock()
				if ok {
					bodies[body]++
				} else {
					fails++
					if fails <= 3 {
						t.Logf("%s: failed: %s", url, why)
					}
				}
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < n; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return fails, bodies
}

// enginePeer is one peer's live state in the engine's GET /<route>/_status.
type enginePeer struct {
	Host       string `json:"host"`
	Port       int32  `json:"port"`
	Active     int    `json:"active"`
	Fails      int    `json:"fails"`
	Ejected    bool   `json:"ejected"`
	Ejections  int    `json:"ejections"`
	Tries      int    `json:"tries"`
	Healthy    bool   `json:"healthy"`
	tier, addr string
}

func enginePeers(t *testing.T, url string) []enginePeer {
	t.Helper()
	resp, err := http.Get(url + "_status")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	var status struct {
		State []struct {
			Use   string       `json:"use"`
			Peers []enginePeer `json:"peers"`
		} `json:"state"`
	}
	if err := json.Unmarshal([]byte(body), &status); err != nil {
		t.Fatalf("_status %q: %v", body, err)
	}
	var out []enginePeer
	for _, tr := range status.State {
		for _, p := range tr.Peers {
			p.tier, p.addr = tr.Use, fmt.Sprintf("%s:%d", p.Host, p.Port)
			out = append(out, p)
		}
	}
	return out
}

func withMode(r *Route, mode string) *Route {
	r.Spec.FailureMode = mode
	return r
}

var cartTier = routespec.Peer{Use: "cart", Priority: 3}

// TestNginxLLMFailOpenPickerDown: the cart tier is dead (its VIP refuses
// connections). FailOpen serves every request through the pool tiers the
// compiler added; FailClose fails every request instead of bypassing cart.
func TestNginxLLMFailOpenPickerDown(t *testing.T) {
	n := startNginx(t)
	a, b := newBackend(t, text("pod-a")), newBackend(t, text("pod-b"))
	svc := newBackend(t, text("svc"))
	snap := Snapshot{
		Backends:       []Endpoint{a.endpoint(t), b.endpoint(t)},
		BackendService: svc.vip(t),
		CartService:    &ServiceVIP{IP: "127.0.0.1", Port: refusingPort(t)},
	}
	open := llmRoute("open", nil, cartTier)
	open.Spec.Cart = &routespec.Cart{OutputConfigMap: "cart-conf"}
	closed := clone(open)
	closed.Name, closed.Spec.Nginx.Route = "closed", "closed"
	install(t, n, withMode(open, routespec.FailOpen), snap)
	install(t, n, withMode(closed, routespec.FailClose), snap)

	fails, bodies := hammer(t, n.URL("open")+"v1/chat", hammerRequests)
	t.Logf("FailOpen, cart dead: %d/%d client failures, served by %v", fails, hammerRequests, bodies)
	if fails != 0 || bodies["pod-a"] == 0 || bodies["pod-b"] == 0 {
		t.Errorf("FailOpen with the cart tier dead: %d failures, bodies %v; want 0 failures, both pool pods serving", fails, bodies)
	}
	cart := enginePeers(t, n.URL("open"))[0]
	if cart.tier != "cart" || !cart.Ejected {
		t.Errorf("dead cart VIP should be ejected after 3 connection failures: %+v", cart)
	}

	fails, bodies = hammer(t, n.URL("closed")+"v1/chat", hammerRequests)
	t.Logf("FailClose (control), cart dead: %d/%d client failures, served by %v", fails, hammerRequests, bodies)
	if fails != hammerRequests {
		t.Errorf("FailClose with the cart tier dead: %d/%d failures, want all (requests must not bypass cart)", fails, hammerRequests)
	}
	if a.hits.Load()+b.hits.Load() != int64(hammerRequests) || svc.hits.Load() != 0 {
		t.Errorf("pool hits %d+%d (want %d, all from FailOpen), svc hits %d (want 0: pod-IP tier first)",
			a.hits.Load(), b.hits.Load(), hammerRequests, svc.hits.Load())
	}
}

// TestNginxLLMFailOpenRefusingEndpoint: a pool endpoint accepts no
// connections. FailOpen retries to another endpoint and ejects it after 3
// connection failures: no client failure, with the picker up-but-bypassed
// (pool-only route) and with the picker dead. FailClose is the control.
func TestNginxLLMFailOpenRefusingEndpoint(t *testing.T) {
	n := startNginx(t)
	a, b := newBackend(t, text("pod-a")), newBackend(t, text("pod-b"))
	dead := Endpoint{IP: "127.0.0.1", Port: refusingPort(t)}
	snap := Snapshot{Backends: []Endpoint{a.endpoint(t), b.endpoint(t), dead}}
	withCart := snap
	withCart.CartService = &ServiceVIP{IP: "127.0.0.1", Port: refusingPort(t)}

	install(t, n, withMode(llmRoute("pool-open", nil, backendTier), routespec.FailOpen), snap)
	install(t, n, withMode(llmRoute("pool-closed", nil, backendTier), routespec.FailClose), snap)
	cartOpen := llmRoute("cart-open", nil, cartTier, backendTier)
	cartOpen.Spec.Cart = &routespec.Cart{OutputConfigMap: "cart-conf"}
	install(t, n, withMode(cartOpen, routespec.FailOpen), withCart)

	for _, tc := range []struct {
		route string
		open  bool
	}{{"pool-open", true}, {"cart-open", true}, {"pool-closed", false}} {
		fails, bodies := hammer(t, n.URL(tc.route)+"v1/chat", hammerRequests)
		t.Logf("%s: %d/%d client failures with one refusing pool endpoint, served by %v", tc.route, fails, hammerRequests, bodies)
		if tc.open && fails != 0 {
			t.Errorf("%s: %d client failures, want 0", tc.route, fails)
		}
		if !tc.open && fails == 0 {
			t.Errorf("%s (control): 0 failures; the refusing endpoint did not refuse, so the FailOpen figures prove nothing", tc.route)
		}
		for _, p := range enginePeers(t, n.URL(tc.route)) {
			if p.addr == fmt.Sprintf("127.0.0.1:%d", dead.Port) {
				if tc.open && (!p.Ejected || p.Ejections != 1) {
					t.Errorf("%s: refusing endpoint %+v, want ejected once", tc.route, p)
				}
				if !tc.open && p.Ejected {
					t.Errorf("%s: FailClose renders no ejection options, but %+v was ejected", tc.route, p)
				}
			} else if p.tier == "backend" && p.Ejected {
				t.Errorf("%s: live endpoint %+v ejected", tc.route, p)
			}
		}
	}
}

// TestNginxLLMFailOpenEjectionCap: at most half of the pool is ejected at
// once, even when more endpoints refuse.
func TestNginxLLMFailOpenEjectionCap(t *testing.T) {
	n := startNginx(t)
	live := newBackend(t, text("live"))
	eps := []Endpoint{live.endpoint(t)}
	for i := 0; i < 3; i++ {
		eps = append(eps, Endpoint{IP: "127.0.0.1", Port: refusingPort(t)})
	}
	install(t, n, withMode(llmRoute("cap", nil, backendTier), routespec.FailOpen), Snapshot{Backends: eps})
	hammer(t, n.URL("cap")+"v1/chat", hammerRequests)
	ejected, refusing := 0, 0
	for _, p := range enginePeers(t, n.URL("cap")) {
		if p.Port != eps[0].Port {
			refusing++
		}
		if p.Ejected {
			ejected++
		}
	}
	if refusing != 3 || ejected != 2 {
		t.Errorf("3 of 4 endpoints refuse: %d ejected, want exactly 2 (max_ejection_percent 50)", ejected)
	}
}

// TestNginxLLMFailOpen503NotEjected: an overloaded backend answering 503 is
// a response, not a connection failure: it is neither retried nor ejected,
// and the client sees its 503.
func TestNginxLLMFailOpen503NotEjected(t *testing.T) {
	n := startNginx(t)
	busy := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "overloaded")
	})
	ok := newBackend(t, text("ok"))
	install(t, n, withMode(llmRoute("busy", nil, backendTier), routespec.FailOpen),
		Snapshot{Backends: []Endpoint{busy.endpoint(t), ok.endpoint(t)}})
	fails, bodies := hammer(t, n.URL("busy")+"v1/chat", 60)
	if int64(fails) != busy.hits.Load() || bodies["ok"] != int(ok.hits.Load()) || busy.hits.Load() < 20 {
		t.Errorf("503 answers %d, busy hits %d, ok %v/%d: want every 503 passed back, none retried, busy still chosen",
			fails, busy.hits.Load(), bodies, ok.hits.Load())
	}
	for _, p := range enginePeers(t, n.URL("busy")) {
		if p.Ejected || p.Fails != 0 {
			t.Errorf("peer %+v: a 503 must not count as a failure", p)
		}
	}
}

// TestNginxVideoFailOpen: a video route has no picker; FailOpen adds the
// pod-IP tier below a listed Service VIP tier, so a dead VIP is bypassed,
// and FailClose keeps only the listed tier. With one refusing pool
// endpoint both modes retry (video routes always rendered
// proxy_next_upstream error timeout), and a 503 is never a failure.
func TestNginxVideoFailOpen(t *testing.T) {
	n := startNginx(t)
	a, b := newBackend(t, text("pod-a")), newBackend(t, text("pod-b"))
	deadVIP := &ServiceVIP{IP: "127.0.0.1", Port: refusingPort(t)}
	snap := Snapshot{Backends: []Endpoint{a.endpoint(t), b.endpoint(t)}, BackendService: deadVIP}
	install(t, n, withMode(videoRoute("vopen", nil, svcTier), routespec.FailOpen), snap)
	install(t, n, withMode(videoRoute("vclosed", nil, svcTier), routespec.FailClose), snap)
	fails, bodies := hammer(t, n.URL("vopen")+"v2/video_generation", hammerRequests)
	t.Logf("video FailOpen, listed VIP tier dead: %d/%d client failures, served by %v", fails, hammerRequests, bodies)
	if fails != 0 || bodies["pod-a"] == 0 || bodies["pod-b"] == 0 {
		t.Errorf("video FailOpen: %d failures, %v", fails, bodies)
	}
	fails, _ = hammer(t, n.URL("vclosed")+"v2/video_generation", hammerRequests)
	t.Logf("video FailClose (control), listed VIP tier dead: %d/%d client failures", fails, hammerRequests)
	if fails != hammerRequests {
		t.Errorf("video FailClose: %d/%d failures, want all", fails, hammerRequests)
	}

	busy := newBackend(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) })
	dead := Endpoint{IP: "127.0.0.1", Port: refusingPort(t)}
	pool := Snapshot{Backends: []Endpoint{a.endpoint(t), b.endpoint(t), dead}}
	install(t, n, withMode(videoRoute("vpool-open", nil, backendTier), routespec.FailOpen), pool)
	install(t, n, withMode(videoRoute("vpool-closed", nil, backendTier), routespec.FailClose), pool)
	install(t, n, withMode(videoRoute("vbusy", nil, backendTier), routespec.FailOpen),
		Snapshot{Backends: []Endpoint{a.endpoint(t), busy.endpoint(t)}})
	for _, route := range []string{"vpool-open", "vpool-closed"} {
		fails, bodies := hammer(t, n.URL(route)+"v2/video_generation", hammerRequests)
		t.Logf("video %s: %d/%d client failures with one refusing pool endpoint, served by %v", route, fails, hammerRequests, bodies)
		if route == "vpool-open" && fails != 0 {
			t.Errorf("%s: %d client failures, want 0", route, fails)
		}
	}
	// nginx's max_fails counts only proxy_next_upstream conditions: after
	// 60 requests the 503 backend still gets its round-robin share.
	before := busy.hits.Load()
	fails, bodies = hammer(t, n.URL("vbusy")+"v2/video_generation", 60)
	if got := busy.hits.Load() - before; got < 20 || int64(fails) != got {
		t.Errorf("503 backend got %d of 60 requests (client saw %d non-200, %v): want its share and every 503 passed back", got, fails, bodies)
	}
}

// steeringHeaders are client headers that try to choose the upstream:
// the ones the route files or the lua contract use (X-Real-IP restores the
// client address; Host is passed to the backend), the usual proxy
// headers, and destination headers other gateways honour.
func steeringHeaders(outside string) map[string]string {
	host, port, _ := net.SplitHostPort(outside)
	return map[string]string{
		"Host":                           outside,
		"X-Real-IP":                      host,
		"X-Forwarded-For":                host,
		"X-Forwarded-Host":               outside,
		"X-Forwarded-Port":               port,
		"Forwarded":                      "for=" + host + ";host=" + outside,
		"X-Gateway-Destination-Endpoint": outside,
		"X-Upstream":                     outside,
		"X-Backend":                      outside,
		"X-Original-URL":                 "http://" + outside + "/",
		"X-Accel-Redirect":               "/" + outside,
		"X-Session-Id":                   outside,
	}
}

// TestNginxFailOpenHeadersCannotSteer: no client header and no
// absolute-form request target can send a request outside the pool, for
// llm and video FailOpen routes, with the picker up and down, through the
// dispatch server and straight into the route's socket (where X-Real-IP is
// not overwritten).
func TestNginxFailOpenHeadersCannotSteer(t *testing.T) {
	n := startNginx(t)
	outside := newBackend(t, text("outside"))
	pod := newBackend(t, text("pod"))
	cart := newBackend(t, text("cart"))
	snap := Snapshot{Backends: []Endpoint{pod.endpoint(t)}, BackendService: pod.vip(t), CartService: cart.vip(t)}
	deadCart := snap
	deadCart.CartService = &ServiceVIP{IP: "127.0.0.1", Port: refusingPort(t)}
	up := llmRoute("llm-up", nil, cartTier)
	up.Spec.Cart = &routespec.Cart{OutputConfigMap: "cart-conf"}
	down := clone(up)
	down.Name, down.Spec.Nginx.Route = "llm-down", "llm-down"
	install(t, n, withMode(up, routespec.FailOpen), snap)
	install(t, n, withMode(down, routespec.FailOpen), deadCart)
	install(t, n, withMode(videoRoute("vid", nil, backendTier), routespec.FailOpen), snap)

	hdr := steeringHeaders(outside.Listener.Addr().String())
	want := map[string]string{"llm-up": "cart", "llm-down": "pod", "vid": "pod"}
	for route, body := range want {
		// Through the dispatch server.
		for i := 0; i < 5; i++ {
			code, got, _ := do(t, nil, "GET", n.URL(route)+"v1/chat", hdr, "")
			if code != 200 || got != body {
				t.Errorf("%s via dispatch: %d %q, want 200 %q", route, code, got, body)
			}
		}
		// Straight into the route's socket, with an absolute-form target.
		for i := 0; i < 5; i++ {
			if got := rawSocketGet(t, n, route, "http://"+outside.Listener.Addr().String()+"/"+route+"/v1/chat", hdr); got != body {
				t.Errorf("%s via socket: body %q, want %q", route, got, body)
			}
		}
	}
	if h := outside.hits.Load(); h != 0 {
		t.Fatalf("a client header steered %d requests outside the pool", h)
	}
}

// rawSocketGet writes one request by hand to the route's unix socket (so
// the request target and every header are exactly what the client chose)
// and returns the response body.
func rawSocketGet(t *testing.T, n *nginxtest.Nginx, route, target string, hdr map[string]string) string {
	t.Helper()
	var d net.Dialer
	c, err := d.DialContext(context.Background(), "unix", n.SockPath(route))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var sb strings.Builder
	sb.WriteString("GET " + target + " HTTP/1.1\r\n")
	for k, v := range hdr {
		sb.WriteString(k + ": " + v + "\r\n")
	}
	sb.WriteString("Connection: close\r\n\r\n")
	if _, err := io.WriteString(c, sb.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	return readAll(t, resp)
}
