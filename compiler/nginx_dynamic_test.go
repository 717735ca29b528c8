package compiler

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// Dynamic peers (issue 27; docs/lua-contract.md, "Dynamic peers") on a
// real nginx running the shipped deploy/openresty/nginx.conf and router.lua
// (nginxtest.Options{Reference: true}), two workers. The route files are
// the contract's dynamic files, made here from today's rendered file by
// the contract's differences only (dynamicLLMConf, dynamicVideoConf); the
// peers tables are internal/peers tables, pushed to the engine's control
// socket as the reload sidecar does.

// dynamicLLMConf is the contract's dynamic llm route file: today's file
// for route, with the registration register_dynamic_route(route, options)
// and no tiers.
func dynamicLLMConf(t testing.TB, n *nginxtest.Nginx, route *Route) []byte {
	t.Helper()
	conf := staticConf(t, n, route)
	name := LuaString(RouteName(route))
	call := "router.register_route(" + name + ", {\n"
	i := strings.Index(conf, call)
	j := strings.Index(conf, "                }, {\n")
	k := strings.Index(conf, "                })\n            end\n")
	if i < 0 || j < i || k < j {
		t.Fatalf("unexpected llm route file:\n%s", conf)
	}
	options := conf[i+len(call) : j]
	out := conf[:i] + "router.register_dynamic_route(" + name + ", {\n" + options + conf[k:]
	if strings.Contains(out, `[ "host" ]`) || strings.Contains(out, "10.9.9.9") {
		t.Fatalf("dynamic llm file names a peer:\n%s", out)
	}
	return []byte(out)
}

// dynamicVideoConf is the contract's dynamic video route file: today's
// file for route with the route's dict declared, the upstream's servers
// replaced by the engine's balancer, and the registration in the access
// phase (after the API key check when there is one).
func dynamicVideoConf(t testing.TB, n *nginxtest.Nginx, route *Route) []byte {
	t.Helper()
	conf := staticConf(t, n, route)
	rn := RouteName(route)
	name := LuaString(rn)
	up := upstreamName(rn)
	i := strings.Index(conf, "upstream "+up+" {\n")
	j := strings.Index(conf[max(i, 0):], "}\n")
	if i < 0 || j < 0 {
		t.Fatalf("unexpected video route file:\n%s", conf)
	}
	conf = conf[:i] + "upstream " + up + " {\n    server 0.0.0.1:1;\n    balancer_by_lua_block {\n        require(\"router\").balance(" + name +
		")\n    }\n}\n" + conf[i+j+2:]
	register := "            local router = require(\"router\")\n" +
		"            if not router.registered(" + name + ") then\n" +
		"                router.register_dynamic_route(" + name + ", {\n" +
		"                    [ \"admission\" ] = \"off\",\n" +
		"                    [ \"eject_consecutive_connect_failures\" ] = \"3\",\n" +
		"                    [ \"ejection_seconds\" ] = \"10\",\n" +
		"                    [ \"kind\" ] = \"video\",\n" +
		"                    [ \"max_ejection_percent\" ] = \"100\",\n" +
		"                    [ \"max_tries\" ] = \"" + strconv.Itoa(videoUpstreamTries) + "\",\n" +
		"                    [ \"retry_on\" ] = \"connect-failure\",\n" +
		"                })\n" +
		"            end\n" +
		"            router.access(" + name + ")\n"
	if a := strings.Index(conf, "        access_by_lua_block {\n"); a >= 0 {
		// api_keys: after the key check, inside its block.
		end := a + strings.Index(conf[a:], "\n        }\n") + 1
		conf = conf[:end] + register + conf[end:]
	} else {
		strip := strings.Index(conf, " break;\n")
		if strip < 0 {
			t.Fatalf("no prefix strip in:\n%s", conf)
		}
		strip += len(" break;\n")
		conf = conf[:strip] + "        access_by_lua_block {\n" + register + "        }\n" + conf[strip:]
	}
	if strings.Contains(conf, "10.9.9.9") {
		t.Fatalf("dynamic video file names a peer:\n%s", conf)
	}
	head := strings.Index(conf, "\n\n") + 2
	return []byte(conf[:head] + "# The engine's per-route lua shared dict, named as the route.\nlua_shared_dict " + rn + " 10m;\n\n" + conf[head:])
}

// staticConf renders route for n's sock dir with a placeholder endpoint
// (the dynamic files drop every peer).
func staticConf(t testing.TB, n *nginxtest.Nginx, route *Route) string {
	t.Helper()
	snap := Snapshot{Backends: []Endpoint{{IP: "10.9.9.9", Port: 9, Ready: true}}}
	res, err := Compile(route, normalized(snap), Options{SockDir: n.SockDir()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := res.Outputs[0].Render(nil)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// installDynamic writes a dynamic route file and reloads nginx.
func installDynamic(t testing.TB, n *nginxtest.Nginx, route string, conf []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(n.RoutesDir(), "session_route_"+route+".conf"), conf, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(); err != nil {
		t.Fatalf("%v\nroute file:\n%s", err, conf)
	}
}

// startDynamic runs the shipped nginx.conf with two workers.
func startDynamic(t testing.TB) *nginxtest.Nginx {
	t.Helper()
	return nginxtest.Start(t, nginxtest.Options{Reference: true, Workers: 2})
}

// table is the encoded peers table of route.
func table(t testing.TB, route string, tiers ...peers.Tier) (peers.Table, []byte) {
	t.Helper()
	tb := peers.Table{Route: route, Tiers: tiers}
	b, err := tb.Encode()
	if err != nil {
		t.Fatal(err)
	}
	tb, err = peers.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return tb, b
}

func peerOf(t testing.TB, b *backend) peers.Peer {
	h, p, err := net.SplitHostPort(b.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(p)
	return peers.Peer{Host: h, Port: int32(port)}
}

func deadPeer(t *testing.T) peers.Peer {
	return peers.Peer{Host: "127.0.0.1", Port: refusingPort(t)}
}

func backendPeers(ps ...peers.Peer) peers.Tier {
	return peers.Tier{Use: "backend", Priority: 2, Peers: ps}
}

// controlClient talks to the engine's control socket.
func controlClient(n *nginxtest.Nginx) *http.Client {
	sock := n.ControlSockPath()
	return &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		// One connection per request: a reload ends the old workers'
		// connections, and a PUT is not retried on a closed one.
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
}

// controlAnswer is the control endpoint's JSON.
type controlAnswer struct {
	Route   string `json:"route"`
	Version string `json:"version"`
	Serial  int64  `json:"serial"`
	Peers   int    `json:"peers"`
	Error   string `json:"error"`
	Routes  map[string]struct {
		Version string `json:"version"`
		Serial  int64  `json:"serial"`
	} `json:"routes"`
}

// control sends one request to the control socket; serial < 0 sends no
// X-Autoconfig-Serial.
func control(t testing.TB, c *http.Client, method, path string, body []byte, serial int64, hdr map[string]string) (int, controlAnswer, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://localhost"+path, strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	if serial >= 0 {
		req.Header.Set(peers.SerialHeader, strconv.FormatInt(serial, 10))
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var a controlAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("%s %s: %d %q: %v", method, path, resp.StatusCode, b, err)
	}
	return resp.StatusCode, a, string(b)
}

// push PUTs a table and fails the test unless the engine acks its version.
func push(t testing.TB, c *http.Client, tb peers.Table, body []byte, serial int64) controlAnswer {
	t.Helper()
	code, a, raw := control(t, c, "PUT", "/peers/"+tb.Route, body, serial, nil)
	if code != 200 || a.Version != tb.Version || a.Route != tb.Route || a.Serial != serial || a.Peers != tb.Peers() {
		t.Fatalf("push %s version %s serial %d: %d %s", tb.Route, tb.Version, serial, code, raw)
	}
	return a
}

// dynStatus is a dynamic route's GET /<route>/_status.
type dynStatus struct {
	Pid     int    `json:"pid"`
	Dynamic bool   `json:"dynamic"`
	Version string `json:"version"`
	Serial  int64  `json:"serial"`
	State   []struct {
		Use   string       `json:"use"`
		Peers []enginePeer `json:"peers"`
	} `json:"state"`
}

func (s dynStatus) peer(use string, p peers.Peer) (enginePeer, bool) {
	for _, tr := range s.State {
		for _, q := range tr.Peers {
			if tr.Use == use && q.Host == p.Host && q.Port == p.Port {
				return q, true
			}
		}
	}
	return enginePeer{}, false
}

// everyWorker asks _status over fresh connections until every worker of
// n has answered, and returns the last answer of each.
func everyWorker(t testing.TB, n *nginxtest.Nginx, route string) map[int]dynStatus {
	t.Helper()
	workers := n.WorkerPIDs()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	seen := map[int]dynStatus{}
	for i := 0; i < 2000 && len(seen) < len(workers); i++ {
		resp, err := c.Get(n.URL(route) + "_status")
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		body := string(raw)
		var s dynStatus
		if err := json.Unmarshal([]byte(body), &s); err != nil || resp.StatusCode != 200 {
			t.Fatalf("_status: %d %q: %v", resp.StatusCode, body, err)
		}
		if !slices.Contains(workers, s.Pid) {
			t.Fatalf("_status from pid %d, not a worker of %v", s.Pid, workers)
		}
		seen[s.Pid] = s
	}
	if len(seen) < len(workers) {
		t.Fatalf("only workers %v answered _status of %v", seen, workers)
	}
	return seen
}

// streamBackend answers /stream with "begin\n", flushed, then "end\n" once
// release is closed; any other path with its name at once.
type streamBackend struct {
	*backend
	started chan struct{}
	release chan struct{}
}

func newStreamBackend(t *testing.T, name string) *streamBackend {
	s := &streamBackend{started: make(chan struct{}, 16), release: make(chan struct{})}
	s.backend = newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stream" {
			io.WriteString(w, name)
			return
		}
		io.WriteString(w, name+" begin\n")
		w.(http.Flusher).Flush()
		s.started <- struct{}{}
		<-s.release
		io.WriteString(w, name+" end\n")
	})
	return s
}

// stream starts a GET whose body is delivered on the returned channel.
func stream(url string) <-chan string {
	out := make(chan string, 1)
	go func() {
		resp, err := http.Get(url)
		if err != nil {
			out <- "error: " + err.Error()
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != 200 {
			out <- fmt.Sprintf("status %d %q: %v", resp.StatusCode, b, err)
			return
		}
		out <- string(b)
	}()
	return out
}

func waitStarted(t *testing.T, s *streamBackend) {
	t.Helper()
	select {
	case <-s.started:
	case <-time.After(10 * time.Second):
		t.Fatal("stream did not reach its backend")
	}
}

// TestNginxDynamicPush: a table pushed over the control socket is acked
// with its version and read back; the very next requests, in every
// worker, reach only the new peers (a removed peer gets none after the
// ack), with no reload (same worker pids).
func TestNginxDynamicPush(t *testing.T) {
	n := startDynamic(t)
	installDynamic(t, n, "dyn", dynamicLLMConf(t, n, llmRoute("dyn", nil, backendTier)))
	c := controlClient(n)
	a, b, d := newBackend(t, text("a")), newBackend(t, text("b")), newBackend(t, text("d"))

	if code, body, _ := do(t, nil, "POST", n.URL("dyn")+"v1/chat", nil, "{}"); code != 503 || !strings.Contains(body, "route dyn: no peers table yet") {
		t.Errorf("no table yet: %d %q, want 503 no peers table yet", code, body)
	}
	if code, _, raw := control(t, c, "GET", "/peers/dyn", nil, -1, nil); code != 404 {
		t.Errorf("GET /peers/dyn before a push: %d %s, want 404", code, raw)
	}
	if code, ans, raw := control(t, c, "GET", "/peers", nil, -1, nil); code != 200 || len(ans.Routes) != 0 || !strings.Contains(raw, `"routes":{}`) {
		t.Errorf("GET /peers before a push: %d %s, want 200 and no route", code, raw)
	}

	t1, b1 := table(t, "dyn", backendPeers(peerOf(t, a), peerOf(t, b)))
	push(t, c, t1, b1, 1)
	if code, ans, raw := control(t, c, "GET", "/peers/dyn", nil, -1, nil); code != 200 || ans.Version != t1.Version || ans.Serial != 1 || ans.Peers != 2 || ans.Route != "dyn" {
		t.Errorf("GET /peers/dyn: %d %s, want version %s serial 1 peers 2", code, raw, t1.Version)
	}
	fails, bodies := hammer(t, n.URL("dyn")+"v1/chat", 60)
	if fails != 0 || bodies["a"] == 0 || bodies["b"] == 0 || len(bodies) != 2 {
		t.Errorf("table {a, b}: %d failures, %v", fails, bodies)
	}

	workers := n.WorkerPIDs()
	t2, b2 := table(t, "dyn", backendPeers(peerOf(t, b), peerOf(t, d)))
	start := time.Now()
	push(t, c, t2, b2, 2)
	ack := time.Since(start)
	aHits := a.hits.Load()
	fails, bodies = hammer(t, n.URL("dyn")+"v1/chat", hammerRequests)
	t.Logf("push {a,b} -> {b,d}: acked in %s; the next %d requests: %d failures, %v; a got %d after the ack", ack, hammerRequests, fails, bodies, a.hits.Load()-aHits)
	if fails != 0 || bodies["a"] != 0 || bodies["b"] == 0 || bodies["d"] == 0 {
		t.Errorf("after the push: %d failures, %v; want only b and d", fails, bodies)
	}
	if got := a.hits.Load(); got != aHits {
		t.Errorf("removed peer a got %d requests after the ack", got-aHits)
	}
	for pid, s := range everyWorker(t, n, "dyn") {
		if !s.Dynamic || s.Version != t2.Version || s.Serial != 2 || len(s.State) != 1 || len(s.State[0].Peers) != 2 {
			t.Errorf("worker %d: _status %+v, want version %s serial 2 with 2 peers", pid, s, t2.Version)
		}
	}
	if code, ans, raw := control(t, c, "GET", "/peers", nil, -1, nil); code != 200 || ans.Routes["dyn"].Version != t2.Version || ans.Routes["dyn"].Serial != 2 {
		t.Errorf("GET /peers: %d %s", code, raw)
	}
	if now := n.WorkerPIDs(); !slices.Equal(now, workers) {
		t.Errorf("workers %v became %v: the push reloaded nginx", workers, now)
	}
}

// TestNginxDynamicStateKept: a peer's state (ejection, active requests)
// survives a table change that keeps the peer, even at another index; a
// peer removed and added again starts afresh.
func TestNginxDynamicStateKept(t *testing.T) {
	n := startDynamic(t)
	route := withMode(llmRoute("keep", map[string]string{"ejection_seconds": "120"}, backendTier), routespec.FailOpen)
	installDynamic(t, n, "keep", dynamicLLMConf(t, n, route))
	c := controlClient(n)
	live := newStreamBackend(t, "live")
	live2 := newBackend(t, text("live2"))
	dead := deadPeer(t)

	t1, b1 := table(t, "keep", backendPeers(dead, peerOf(t, live.backend)))
	push(t, c, t1, b1, 1)
	if fails, bodies := hammer(t, n.URL("keep")+"v1/chat", 60); fails != 0 || bodies["live"] != 60 {
		t.Fatalf("table {dead, live}: %d failures, %v", fails, bodies)
	}
	held := stream(n.URL("keep") + "stream")
	waitStarted(t, live)
	before, _ := everyWorker(t, n, "keep")[n.WorkerPIDs()[0]].peer("backend", dead)
	if !before.Ejected || before.Ejections != 1 {
		t.Fatalf("dead peer %+v, want ejected once", before)
	}

	// The new table lists another peer first: dead and live move.
	t2, b2 := table(t, "keep", backendPeers(peerOf(t, live2), dead, peerOf(t, live.backend)))
	push(t, c, t2, b2, 2)
	for pid, s := range everyWorker(t, n, "keep") {
		d, _ := s.peer("backend", dead)
		l, _ := s.peer("backend", peerOf(t, live.backend))
		if s.Version != t2.Version || !d.Ejected || d.Ejections != 1 || d.Tries != before.Tries || l.Active != 1 {
			t.Errorf("worker %d after the change: version %s, dead %+v, live %+v; want dead still ejected (tries %d), live active 1",
				pid, s.Version, d, l, before.Tries)
		}
	}
	if fails, bodies := hammer(t, n.URL("keep")+"v1/chat", 60); fails != 0 || bodies["live2"] == 0 {
		t.Errorf("table {live2, dead, live}: %d failures, %v", fails, bodies)
	}
	s := everyWorker(t, n, "keep")[n.WorkerPIDs()[0]]
	if d, _ := s.peer("backend", dead); d.Tries != before.Tries || !d.Ejected {
		t.Errorf("ejected dead peer tried again: %+v (tries before %d)", d, before.Tries)
	}
	close(live.release)
	if got := <-held; got != "live begin\nlive end\n" {
		t.Errorf("held stream: %q", got)
	}
	for pid, s := range everyWorker(t, n, "keep") {
		for _, tr := range s.State {
			for _, p := range tr.Peers {
				if p.Active != 0 {
					t.Errorf("worker %d: %s %s:%d active %d after every request ended", pid, tr.Use, p.Host, p.Port, p.Active)
				}
			}
		}
	}

	// Removed, then listed again: a new peer, no ejection.
	t3, b3 := table(t, "keep", backendPeers(peerOf(t, live2), peerOf(t, live.backend)))
	push(t, c, t3, b3, 3)
	push(t, c, t2, b2, 4)
	for pid, s := range everyWorker(t, n, "keep") {
		if d, _ := s.peer("backend", dead); d.Ejected || d.Ejections != 0 || d.Tries != 0 {
			t.Errorf("worker %d: dead peer removed and listed again: %+v, want fresh state", pid, d)
		}
	}
}

// TestNginxDynamicStreams: a stream in flight to a peer the new table
// removes finishes, so does one to a peer that stays (at another index);
// each releases its own peer's slot.
func TestNginxDynamicStreams(t *testing.T) {
	n := startDynamic(t)
	installDynamic(t, n, "str", dynamicLLMConf(t, n, llmRoute("str", nil, backendTier)))
	c := controlClient(n)
	gone, stay := newStreamBackend(t, "gone"), newStreamBackend(t, "stay")
	fresh := newBackend(t, text("fresh"))

	t1, b1 := table(t, "str", backendPeers(peerOf(t, gone.backend), peerOf(t, stay.backend)))
	push(t, c, t1, b1, 1)
	// Least connections: the second stream goes to the other peer.
	s1 := stream(n.URL("str") + "stream")
	var first, second *streamBackend
	select {
	case <-gone.started:
		first, second = gone, stay
	case <-stay.started:
		first, second = stay, gone
	case <-time.After(10 * time.Second):
		t.Fatal("first stream reached no backend")
	}
	s2 := stream(n.URL("str") + "stream")
	waitStarted(t, second)
	streams := map[*streamBackend]<-chan string{first: s1, second: s2}

	// stay moves from index 2 to 1; fresh takes index 2.
	t2, b2 := table(t, "str", backendPeers(peerOf(t, stay.backend), peerOf(t, fresh)))
	push(t, c, t2, b2, 2)
	goneHits := gone.hits.Load()
	fails, bodies := hammer(t, n.URL("str")+"v1/chat", 60)
	if fails != 0 || bodies["gone"] != 0 || gone.hits.Load() != goneHits || bodies["fresh"] == 0 {
		t.Errorf("after removing gone: %d failures, %v", fails, bodies)
	}

	close(gone.release)
	if got := <-streams[gone]; got != "gone begin\ngone end\n" {
		t.Errorf("stream to the removed peer: %q", got)
	}
	for pid, s := range everyWorker(t, n, "str") {
		st, _ := s.peer("backend", peerOf(t, stay.backend))
		fr, _ := s.peer("backend", peerOf(t, fresh))
		if st.Active != 1 || fr.Active != 0 {
			t.Errorf("worker %d, the removed peer's stream ended: stay active %d (want 1, its stream runs), fresh %d (want 0)", pid, st.Active, fr.Active)
		}
	}
	close(stay.release)
	if got := <-streams[stay]; got != "stay begin\nstay end\n" {
		t.Errorf("stream to the staying peer: %q", got)
	}
	for pid, s := range everyWorker(t, n, "str") {
		for _, tr := range s.State {
			for _, p := range tr.Peers {
				if p.Active != 0 {
					t.Errorf("worker %d: %s:%d active %d after both streams ended", pid, p.Host, p.Port, p.Active)
				}
			}
		}
	}
}

// TestNginxDynamicProbe: a tier with a probe_path that appears in a
// pushed table starts the health probes (the route registered without
// one); a peer failing its probe leaves the pick.
func TestNginxDynamicProbe(t *testing.T) {
	n := startDynamic(t)
	installDynamic(t, n, "prb", dynamicLLMConf(t, n, llmRoute("prb", map[string]string{"health_probe_interval_seconds": "1"}, backendTier)))
	c := controlClient(n)
	health := func(name string, code int) *backend {
		return newBackend(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/health" {
				w.WriteHeader(code)
			}
			io.WriteString(w, name)
		})
	}
	good, sick := health("good", 200), health("sick", 500)

	t1, b1 := table(t, "prb", backendPeers(peerOf(t, good), peerOf(t, sick)))
	push(t, c, t1, b1, 1)
	if fails, bodies := hammer(t, n.URL("prb")+"v1/chat", 40); fails != 0 || bodies["good"] == 0 || bodies["sick"] == 0 {
		t.Fatalf("no probe path: %d failures, %v; want both serving", fails, bodies)
	}
	tier := backendPeers(peerOf(t, good), peerOf(t, sick))
	tier.ProbePath = "/health"
	t2, b2 := table(t, "prb", tier)
	push(t, c, t2, b2, 2)
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := 0
		for _, s := range everyWorker(t, n, "prb") {
			if p, _ := s.peer("backend", peerOf(t, sick)); !p.Healthy {
				out++
			}
		}
		if out == len(n.WorkerPIDs()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sick peer never failed a probe (probe path pushed in a table)")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if fails, bodies := hammer(t, n.URL("prb")+"v1/chat", 40); fails != 0 || bodies["good"] != 40 {
		t.Errorf("sick peer unhealthy: %d failures, %v; want only good", fails, bodies)
	}
	if r := sick.last(); r == nil || r.URL.Path != "/health" || r.Header.Get("User-Agent") != "autoconfig-router-probe" {
		t.Errorf("sick peer's last request %v, want a probe", r)
	}
}

// TestNginxDynamicAdmission: a pushed tier's max_concurrency is the
// admission limit (503 + Retry-After when every peer is full), and a
// table without a peer answers 503.
func TestNginxDynamicAdmission(t *testing.T) {
	n := startDynamic(t)
	installDynamic(t, n, "adm", dynamicLLMConf(t, n, llmRoute("adm", nil, backendTier)))
	c := controlClient(n)
	one := newStreamBackend(t, "one")
	tier := backendPeers(peerOf(t, one.backend))
	tier.MaxConcurrency = 1
	t1, b1 := table(t, "adm", tier)
	push(t, c, t1, b1, 1)
	held := stream(n.URL("adm") + "stream")
	waitStarted(t, one)
	if code, body, h := do(t, nil, "GET", n.URL("adm")+"v1/chat", nil, ""); code != 503 || h.Get("Retry-After") != "1" || !strings.Contains(body, "max_concurrency") {
		t.Errorf("second request with max_concurrency 1: %d %q, want 503 Retry-After 1", code, body)
	}
	close(one.release)
	if got := <-held; got != "one begin\none end\n" {
		t.Errorf("held stream: %q", got)
	}
	// The stream's slot is given back in nginx's log phase, which runs
	// just after the client has the last byte: ask until it is back
	// (bounded), then the request must be admitted.
	var code int
	var body string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, body, _ = do(t, nil, "GET", n.URL("adm")+"v1/chat", nil, "")
		if code == 200 || time.Now().After(deadline) {
			break
		}
	}
	if code != 200 || body != "one" {
		t.Errorf("after the stream ended: %d %q", code, body)
	}

	t2, b2 := table(t, "adm", backendPeers())
	push(t, c, t2, b2, 2)
	if code, body, _ := do(t, nil, "GET", n.URL("adm")+"v1/chat", nil, ""); code != 503 || !strings.Contains(body, "has no peer") {
		t.Errorf("table without a peer: %d %q, want 503", code, body)
	}
}

// TestNginxDynamicSeed: a fresh nginx serves the seed file
// peers_<route>.json; a push replaces it, a reload (init_by_lua runs
// again, the dict stays) keeps the push, and a restart (the dict is lost)
// serves the seed again.
func TestNginxDynamicSeed(t *testing.T) {
	n := startDynamic(t)
	c := controlClient(n)
	a, b := newBackend(t, text("a")), newBackend(t, text("b"))
	ts, bs := table(t, "seeded", backendPeers(peerOf(t, a)))
	if err := os.WriteFile(filepath.Join(n.RoutesDir(), peers.Key("seeded")), bs, 0o644); err != nil {
		t.Fatal(err)
	}
	conf := dynamicLLMConf(t, n, llmRoute("seeded", nil, backendTier))
	if err := os.WriteFile(filepath.Join(n.RoutesDir(), "session_route_seeded.conf"), conf, 0o644); err != nil {
		t.Fatal(err)
	}
	restart := func() {
		t.Helper()
		if err := n.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := n.Relaunch(); err != nil {
			t.Fatal(err)
		}
		c.CloseIdleConnections()
	}
	served := func(step string, want string) {
		t.Helper()
		fails, bodies := hammer(t, n.URL("seeded")+"v1/chat", 40)
		if fails != 0 || bodies[want] != 40 {
			t.Errorf("%s: %d failures, %v; want all from %s", step, fails, bodies, want)
		}
	}
	peersOf := func(step, version string, serial int64) {
		t.Helper()
		if code, ans, raw := control(t, c, "GET", "/peers/seeded", nil, -1, nil); code != 200 || ans.Version != version || ans.Serial != serial {
			t.Errorf("%s: GET /peers/seeded %d %s, want version %s serial %d", step, code, raw, version, serial)
		}
	}

	restart()
	served("fresh start with a seed file", "a")
	peersOf("seeded", ts.Version, 0)

	tp, bp := table(t, "seeded", backendPeers(peerOf(t, b)))
	push(t, c, tp, bp, 7)
	served("after the push", "b")
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	served("after a reload", "b")
	peersOf("after a reload", tp.Version, 7)
	for pid, s := range everyWorker(t, n, "seeded") {
		if s.Version != tp.Version || s.Serial != 7 {
			t.Errorf("worker %d after a reload: version %s serial %d, want the push's", pid, s.Version, s.Serial)
		}
	}

	restart()
	served("after a restart", "a")
	peersOf("after a restart", ts.Version, 0)
}

// TestNginxDynamicRefusals: the control endpoint refuses what it must,
// with the contract's status codes, and a refused push leaves the last
// good table served; nothing reaches it through the dispatch server.
func TestNginxDynamicRefusals(t *testing.T) {
	n := startDynamic(t)
	installDynamic(t, n, "small", dynamicLLMConf(t, n, llmRoute("small", map[string]string{SharedDictSizeKey: "64k"}, backendTier)))
	c := controlClient(n)
	a := newBackend(t, text("a"))
	good, goodBody := table(t, "small", backendPeers(peerOf(t, a)))
	push(t, c, good, goodBody, 3)

	stillGood := func(step string) {
		t.Helper()
		if code, ans, raw := control(t, c, "GET", "/peers/small", nil, -1, nil); code != 200 || ans.Version != good.Version || ans.Serial != 3 {
			t.Errorf("%s: GET /peers/small %d %s, want the last good table (version %s, serial 3)", step, code, raw, good.Version)
		}
		if fails, bodies := hammer(t, n.URL("small")+"v1/chat", 12); fails != 0 || bodies["a"] != 12 {
			t.Errorf("%s: %d failures, %v; want the last good table served", step, fails, bodies)
		}
	}

	_, otherBody := table(t, "other", backendPeers(peerOf(t, a)))
	edit := func(f func(m map[string]any)) []byte {
		var m map[string]any
		json.Unmarshal(goodBody, &m)
		f(m)
		b, _ := json.Marshal(m)
		return b
	}
	port := func(p any) []byte {
		return edit(func(m map[string]any) {
			m["tiers"].([]any)[0].(map[string]any)["peers"].([]any)[0].(map[string]any)["port"] = p
		})
	}
	host := func(h string) []byte {
		return edit(func(m map[string]any) {
			m["tiers"].([]any)[0].(map[string]any)["peers"].([]any)[0].(map[string]any)["host"] = h
		})
	}
	split := func(k, v string) []byte {
		return edit(func(m map[string]any) {
			m["format"] = 2
			c := map[string]any{"weight": 10, "tiers": []any{}}
			c[k] = v
			m["canary"] = c
		})
	}
	for _, tc := range []struct {
		name   string
		body   []byte
		serial int64
		hdr    map[string]string
		want   int
	}{
		// Hosts the balancer cannot dial (it takes IP literals only):
		// refused, not accepted and then failed at every request.
		{"host a name", host("example.com"), 4, nil, 400},
		{"host with a port", host("127.0.0.1:18001"), 4, nil, 400},
		{"host with a space", host("127.0.0.1 "), 4, nil, 400},
		{"host in brackets", host("[::1]"), 4, nil, 400},
		{"host with an IPv6 zone", host("fe80::1%lo"), 4, nil, 400},
		{"host an octet too large", host("10.0.0.256"), 4, nil, 400},
		// A split the engine would not apply as written.
		{"sticky_cookie not a token", split("sticky_cookie", "a=b; Domain=evil"), 4, nil, 400},
		{"sticky_header not a header name", split("sticky_header", "x session"), 4, nil, 400},
		{"override_header empty", split("override_header", ""), 4, nil, 400},
		// Judged on its digits: 2^53 + 1 would read as 2^53.
		{"serial above 2^53", goodBody, 4, map[string]string{peers.SerialHeader: "9007199254740993"}, 400},
		{"serial of 17 digits", goodBody, 4, map[string]string{peers.SerialHeader: "10000000000000000"}, 400},
		{"malformed JSON", []byte(`{"format":1,"route":"small",`), 4, nil, 400},
		{"not an object", []byte(`[1,2]`), 4, nil, 400},
		{"unknown format", edit(func(m map[string]any) { m["format"] = 2 }), 4, nil, 400},
		{"no format", edit(func(m map[string]any) { delete(m, "format") }), 4, nil, 400},
		{"route mismatch", otherBody, 4, nil, 400},
		{"no version", edit(func(m map[string]any) { delete(m, "version") }), 4, nil, 400},
		{"empty version", edit(func(m map[string]any) { m["version"] = "" }), 4, nil, 400},
		{"tiers not an array", edit(func(m map[string]any) { m["tiers"] = map[string]any{"a": 1} }), 4, nil, 400},
		{"port 0", port(0), 4, nil, 400},
		{"port 65536", port(65536), 4, nil, 400},
		{"port not a number", port("80"), 4, nil, 400},
		{"host missing", edit(func(m map[string]any) {
			delete(m["tiers"].([]any)[0].(map[string]any)["peers"].([]any)[0].(map[string]any), "host")
		}), 4, nil, 400},
		{"empty body", nil, 4, nil, 400},
		{"no serial", goodBody, -1, nil, 400},
		{"serial not a number", goodBody, 4, map[string]string{peers.SerialHeader: "x1"}, 400},
		{"serial negative", goodBody, 4, map[string]string{peers.SerialHeader: "-1"}, 400},
		{"lower serial", goodBody, 2, nil, 409},
		{"proxied (X-Real-IP)", goodBody, 4, map[string]string{"X-Real-IP": "127.0.0.1"}, 403},
	} {
		code, _, body := control(t, c, "PUT", "/peers/small", tc.body, tc.serial, tc.hdr)
		if code != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, code, body, tc.want)
		}
		stillGood(tc.name)
	}
	if code, _, raw := control(t, c, "GET", "/peers", nil, -1, map[string]string{"X-Real-IP": "10.0.0.1"}); code != 403 {
		t.Errorf("GET /peers with X-Real-IP: %d %s, want 403", code, raw)
	}
	if code, _, raw := control(t, c, "PUT", "/peers/nodict", goodBody, 4, nil); code != 404 {
		t.Errorf("PUT to a route without a dict: %d %s, want 404", code, raw)
	}
	if code, _, raw := control(t, c, "DELETE", "/peers/small", nil, -1, nil); code != 405 {
		t.Errorf("DELETE: %d %s, want 405", code, raw)
	}
	// The same table again with the same serial: accepted (a re-push).
	push(t, c, good, goodBody, 3)

	// 5000 peers do not fit a 64k dict: 507, the last good table stays in
	// the dict (a reload's new workers read it) and is served.
	var many []peers.Peer
	for i := 0; i < 5000; i++ {
		many = append(many, peers.Peer{Host: fmt.Sprintf("10.%d.%d.%d", i/62500, i/250%250, i%250+1), Port: 8000})
	}
	big, bigBody := table(t, "small", backendPeers(many...))
	if code, _, raw := control(t, c, "PUT", "/peers/small", bigBody, 9, nil); code != 507 {
		t.Errorf("table of %d bytes into a 64k dict: %d %s, want 507", len(bigBody), code, raw)
	}
	t.Logf("%d peers (%d bytes, version %s) into a 64k dict: refused", big.Peers(), len(bigBody), big.Version)
	stillGood("after the 507")
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	stillGood("after the 507 and a reload")
	// A push with a lower serial than the refused one is fine: a refusal
	// stores nothing.
	push(t, c, good, goodBody, 4)

	// The greatest serial, 2^53, is taken; a lower one is then refused
	// (the ordering guard holds at the top of the range).
	if code, ans, raw := control(t, c, "PUT", "/peers/small", goodBody, 9007199254740992, nil); code != 200 || ans.Serial != 9007199254740992 {
		t.Errorf("serial 2^53: %d %s, want 200", code, raw)
	}
	if code, _, raw := control(t, c, "PUT", "/peers/small", goodBody, 9007199254740991, nil); code != 409 {
		t.Errorf("serial 2^53 - 1 after 2^53: %d %s, want 409", code, raw)
	}

	// The dispatch server cannot reach the control socket.
	for _, path := range []string{"/autoconfig@control/peers", "/autoconfig%40control/peers", "/autoconfig@control/peers/small"} {
		resp, err := http.Get("http://" + n.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		if resp.StatusCode == 200 || strings.Contains(body, "routes") || strings.Contains(body, good.Version) {
			t.Errorf("dispatch GET %s: %d %q: reached the control endpoint", path, resp.StatusCode, body)
		}
	}
}

// TestNginxDynamicVideo: a dynamic video route stays a plain proxy (path
// strip, forwarding headers, its /_status is the backend's); the lower
// tier serves only while every primary is refused or ejected; admission is
// off; tiers of equal priority are one primary group.
func TestNginxDynamicVideo(t *testing.T) {
	n := startDynamic(t)
	installDynamic(t, n, "vid", dynamicVideoConf(t, n, videoRoute("vid", nil, backendTier, svcTier)))
	c := controlClient(n)
	svc, live := newBackend(t, text("svc")), newStreamBackend(t, "live")
	busy := newBackend(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "overloaded", 503) })
	other := newBackend(t, text("other"))
	svcTierOf := func(b *backend) peers.Tier {
		return peers.Tier{Use: "backend-svc", Priority: 1, Peers: []peers.Peer{peerOf(t, b)}}
	}
	dead1, dead2 := deadPeer(t), deadPeer(t)

	t1, b1 := table(t, "vid", backendPeers(dead1, dead2), svcTierOf(svc))
	push(t, c, t1, b1, 1)
	for i := 0; i < 8; i++ {
		method := []string{"GET", "POST"}[i%2]
		if code, body, _ := do(t, nil, method, n.URL("vid")+"v2/video_generation", nil, `{"prompt":"x"}`); code != 200 || body != "svc" {
			t.Fatalf("%s #%d with every primary refusing: %d %q, want the lower tier", method, i, code, body)
		}
	}
	if r := svc.last(); r.URL.Path != "/v2/video_generation" || r.Header.Get("X-Forwarded-Host") != "127.0.0.1" || r.Header.Get("X-Forwarded-Proto") != "http" {
		t.Errorf("backend saw %s %v", r.URL.Path, r.Header)
	}
	for _, d := range []peers.Peer{dead1, dead2} {
		if want := fmt.Sprintf("route vid: ejected backend peer 127.0.0.1:%d", d.Port); !strings.Contains(n.ErrorLog(), want) {
			t.Errorf("error log lacks %q (3 failures within 10 s eject, as max_fails=3 fail_timeout=10s)", want)
		}
	}
	// A plain proxy: the engine's endpoints are the backend's paths.
	if code, body, _ := do(t, nil, "GET", n.URL("vid")+"_status", nil, ""); code != 200 || body != "svc" {
		t.Errorf("GET /vid/_status: %d %q, want the backend's answer", code, body)
	}

	t2, b2 := table(t, "vid", backendPeers(dead1, peerOf(t, live.backend)), svcTierOf(svc))
	push(t, c, t2, b2, 2)
	svcHits := svc.hits.Load()
	for i := 0; i < 20; i++ {
		method := []string{"GET", "POST"}[i%2]
		if code, body, _ := do(t, nil, method, n.URL("vid")+"v2/video_generation", nil, `{"prompt":"x"}`); code != 200 || body != "live" {
			t.Errorf("%s #%d with one live primary: %d %q", method, i, code, body)
		}
	}
	if got := svc.hits.Load() - svcHits; got != 0 {
		t.Errorf("lower tier got %d requests while a primary was up", got)
	}

	// admission off: a peer over its max_concurrency still takes requests
	// (no 503); the lower tier still waits for every primary to be out.
	t3, b3 := table(t, "vid", peers.Tier{Use: "backend", Priority: 2, MaxConcurrency: 1, Peers: []peers.Peer{peerOf(t, live.backend)}}, svcTierOf(svc))
	push(t, c, t3, b3, 3)
	held := stream(n.URL("vid") + "stream")
	waitStarted(t, live)
	for i := 0; i < 5; i++ {
		if code, body, _ := do(t, nil, "GET", n.URL("vid")+"v2/x", nil, ""); code != 200 || body != "live" {
			t.Errorf("request #%d beyond max_concurrency 1: %d %q, want 200 from the primary", i, code, body)
		}
	}
	close(live.release)
	if got := <-held; got != "live begin\nlive end\n" {
		t.Errorf("held stream: %q", got)
	}

	// A 503 is an answer: passed back, not retried.
	t4, b4 := table(t, "vid", backendPeers(peerOf(t, busy), peerOf(t, other)), svcTierOf(svc))
	push(t, c, t4, b4, 4)
	before := busy.hits.Load() + other.hits.Load()
	n503 := 0
	for i := 0; i < 20; i++ {
		code, _, _ := do(t, nil, "GET", n.URL("vid")+"v2/x", nil, "")
		if code == 503 {
			n503++
		}
	}
	if got := busy.hits.Load() + other.hits.Load() - before; got != 20 || int64(n503) > busy.hits.Load() || n503 < 5 {
		t.Errorf("20 requests: backends saw %d, client got %d 503s (busy answered %d): want no retry, busy keeps its share", got, n503, busy.hits.Load())
	}

	// With api_keys the registration follows the key check.
	installDynamic(t, n, "vkey", dynamicVideoConf(t, n, videoRoute("vkey", map[string]string{"api_keys": "sk-1"}, backendTier)))
	tk, bk := table(t, "vkey", backendPeers(peerOf(t, other)))
	push(t, c, tk, bk, 1)
	if code, _, h := do(t, nil, "GET", n.URL("vkey")+"v2/video_generation", nil, ""); code != 401 || h.Get("WWW-Authenticate") != "Bearer" {
		t.Errorf("vkey without a key: %d, want 401", code)
	}
	if code, body, _ := do(t, nil, "GET", n.URL("vkey")+"v2/video_generation", map[string]string{"Authorization": "Bearer sk-1"}, ""); code != 200 || body != "other" {
		t.Errorf("vkey with its key: %d %q", code, body)
	}

	// Equal priorities: one primary group, as nginx's non-backup servers.
	t5, b5 := table(t, "vid", peers.Tier{Use: "backend", Priority: 2, Peers: []peers.Peer{peerOf(t, other)}}, peers.Tier{Use: "backend-svc", Priority: 2, Peers: []peers.Peer{peerOf(t, svc)}})
	push(t, c, t5, b5, 5)
	if fails, bodies := hammer(t, n.URL("vid")+"v2/video_generation", 60); fails != 0 || bodies["svc"] == 0 || bodies["other"] == 0 {
		t.Errorf("two tiers of priority 2: %d failures, %v; want both serving", fails, bodies)
	}
}

// benchPeers is a table of n peers that all reach one local server: the
// hosts are 127.1.x.y (all loopback on Linux), the port the server's.
func benchPeers(n int, port int32, variant int) []peers.Peer {
	ps := make([]peers.Peer, n)
	for i := range ps {
		ps[i] = peers.Peer{Host: fmt.Sprintf("127.1.%d.%d", i/250, i%250+1), Port: port}
	}
	// One peer differs per variant, so consecutive pushes change the version.
	ps[n-1].Host = fmt.Sprintf("127.2.%d.%d", variant/250%250, variant%250+1)
	return ps
}

// BenchmarkPushAck: push -> ack latency over the control socket, the
// latency of the first request after a change (its worker decodes the
// table) and of a request without change, with 1,000 and 10,000 peers in
// one backend tier, on the shipped nginx.conf (2 workers).
//
//	go test -run '^$' -bench BenchmarkPush -benchtime 20x ./compiler
func BenchmarkPushAck(b *testing.B) {
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
	go srv.Serve(l)
	defer srv.Close()
	port := int32(l.Addr().(*net.TCPAddr).Port)

	for _, size := range []int{1000, 10000} {
		n := startDynamic(b)
		installDynamic(b, n, "bench", dynamicLLMConf(b, n, llmRoute("bench", nil, backendTier)))
		c := controlClient(n)
		client := &http.Client{Timeout: 30 * time.Second}
		var serial int64
		variant := 0
		next := func(b testing.TB) (peers.Table, []byte) {
			variant++
			serial++
			return table(b, "bench", backendPeers(benchPeers(size, port, variant)...))
		}
		get := func(b testing.TB) {
			resp, err := client.Get(n.URL("bench") + "v1/models")
			if err != nil {
				b.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(body) != "ok" {
				b.Fatalf("%d %q", resp.StatusCode, body)
			}
		}
		tb, body := next(b)
		push(b, c, tb, body, serial)
		get(b)
		b.Run(fmt.Sprintf("peers=%d/push-ack", size), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				tb, body := next(b)
				b.StartTimer()
				push(b, c, tb, body, serial)
			}
		})
		b.Run(fmt.Sprintf("peers=%d/first-request-after-change", size), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				tb, body := next(b)
				push(b, c, tb, body, serial)
				b.StartTimer()
				get(b)
			}
		})
		b.Run(fmt.Sprintf("peers=%d/request-no-change", size), func(b *testing.B) {
			get(b)
			get(b)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				get(b)
			}
		})
		if err := n.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
