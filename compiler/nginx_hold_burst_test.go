package compiler

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
)

// This file: a burst of held requests on a real nginx running the shipped
// nginx.conf (docs/lua-contract.md, "Holding requests at zero"). Every
// request is answered 200 (held, then served by the pod pushed) or 503
// with Retry-After (refused at once: hold_max, the engine's bound, or a
// route socket that took no connection) — never 500, 502 or a dropped
// connection — and a served route answers 200 during the burst.

// burstSize is the requests of a burst.
const burstSize = 5000

// raiseNofile raises the test process's open-file limit to its hard
// limit (nginx's workers inherit it): a burst needs a descriptor per
// connection.
func raiseNofile(t *testing.T, need uint64) {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur < rl.Max {
		old := rl.Cur
		rl.Cur = rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			rl.Cur = old
			syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
		})
	}
	if rl.Max < need {
		t.Fatalf("open-file limit %d, a burst of %d requests needs %d (ulimit -n)", rl.Max, burstSize, need)
	}
}

// engineHold is GET /demand's engine entry.
type engineHold struct {
	Waiting           int `json:"waiting"`
	Max               int `json:"max"`
	Workers           int `json:"workers"`
	WorkerConnections int `json:"worker_connections"`
}

// demandAll is GET /demand: every route's waiting count and the engine's.
func demandAll(t *testing.T, c *http.Client) (map[string]demandEntry, engineHold) {
	t.Helper()
	resp, err := c.Get("http://localhost/demand")
	if err != nil {
		t.Fatalf("GET /demand: %v", err)
	}
	defer resp.Body.Close()
	var a struct {
		Routes map[string]demandEntry `json:"routes"`
		Engine engineHold             `json:"engine"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(b, &a) != nil {
		t.Fatalf("GET /demand: %d %s", resp.StatusCode, b)
	}
	return a.Routes, a.Engine
}

// burstResult is how a burst was answered.
type burstResult struct {
	counts  map[string]int // "200", "503", "503 without Retry-After", other codes, "error"
	held    int            // requests waiting once every request was held or answered
	engine  engineHold
	refused map[string]string // reason → autoconfig_engine_admission_refusals_total, summed over routes
}

func (b burstResult) String() string {
	keys := make([]string, 0, len(b.counts))
	for k := range b.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s×%d", k, b.counts[k]))
	}
	return fmt.Sprintf("%s (held %d; engine bound %d = %d workers × %d connections / 8; refusals %v)",
		strings.Join(parts, ", "), b.held, b.engine.Max, b.engine.Workers, b.engine.WorkerConnections, b.refused)
}

// burst installs routes at zero (dynamic peers, empty tables) and a
// served route, sends burstSize requests spread over the routes (at once,
// or in waves 100 ms apart), asks the served route while they are held,
// pushes a pod to every route and returns how the burst was answered.
func burst(t *testing.T, n *nginxtest.Nginx, routes []*Route, waves int) burstResult {
	t.Helper()
	c := controlClient(n)
	for _, r := range routes {
		installHold(t, n, c, r)
	}
	// The served route: a static route file with a pod.
	served := holdRoute("served", "", nil)
	served.Spec.ScaleToZero = nil
	be := newBackend(t, text("served"))
	conf, _ := holdOutputs(t, n, served, Snapshot{Backends: []Endpoint{be.endpoint(t)}}, false)
	if err := os.WriteFile(filepath.Join(n.RoutesDir(), RouteKey(served)), conf, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}

	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	post := func(url string) (code int, body, retryAfter string, err error) {
		resp, err := client.Post(url+"v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"qwen","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			return 0, "", "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b)), resp.Header.Get("Retry-After"), err
	}
	type answer struct {
		key  string
		note string
	}
	answers := make(chan answer, burstSize)
	var answered atomic.Int64
	var pushed atomic.Bool
	for i := range burstSize {
		if i > 0 && i%(burstSize/waves) == 0 {
			time.Sleep(100 * time.Millisecond)
		}
		url := n.URL(RouteName(routes[i%len(routes)]))
		go func() {
			code, body, ra, err := post(url)
			a := answer{key: strconv.Itoa(code)}
			switch {
			case err != nil:
				a = answer{key: "error", note: err.Error() + fmt.Sprintf(" (pushed %v)", pushed.Load())}
			case code == 503 && ra == "":
				a = answer{key: "503 without Retry-After", note: body}
			case code == 200 && body != "pod":
				a = answer{key: "200 not from the pod", note: body}
			case code != 200 && code != 503:
				a.note = body
			}
			answered.Add(1)
			answers <- a
		}()
	}
	// While the burst arrives, the served route answers.
	servedDuring := make(chan string, 1)
	go func() {
		code, body, _, err := post(n.URL("served"))
		servedDuring <- fmt.Sprint(code, " ", body, " ", err)
	}()

	// Every request is held or answered: the held ones wait.
	res := burstResult{counts: map[string]int{}, refused: map[string]string{}}
	deadline := time.Now().Add(40 * time.Second)
	for {
		dm, eng := demandAll(t, c)
		held := 0
		for _, r := range routes {
			held += dm[RouteName(r)].Waiting
		}
		res.held, res.engine = held, eng
		if int(answered.Load())+held == burstSize {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("burst: %d answered and %d held of %d after 40 s", answered.Load(), held, burstSize)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if res.engine.Waiting != res.held {
		t.Errorf("engine waiting %d, the routes' waiting sum %d", res.engine.Waiting, res.held)
	}
	if res.held > res.engine.Max {
		t.Errorf("%d requests held, more than the engine's bound %d", res.held, res.engine.Max)
	}
	if got := <-servedDuring; got != "200 served <nil>" {
		t.Errorf("the served route during the burst: %s", got)
	}
	if code, body, _, err := post(n.URL("served")); code != 200 || err != nil {
		t.Errorf("the served route with %d requests held: %d %q %v", res.held, code, body, err)
	}

	var spread []int
	for _, pid := range n.WorkerPIDs() {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		spread = append(spread, len(fds))
	}
	t.Logf("%d held: the workers' open descriptors %v", res.held, spread)
	pushed.Store(true)
	for _, r := range routes {
		pushPod(t, n, c, r, 2)
	}
	notes := map[string]string{}
	for range burstSize {
		a := <-answers
		res.counts[a.key]++
		if a.note != "" && notes[a.key] == "" {
			notes[a.key] = a.note
		}
	}
	for _, reason := range []string{"hold_full", "hold_engine_full", "dispatch_busy", "hold_timeout"} {
		sum := 0
		for _, r := range routes {
			v, _ := strconv.Atoi(metricValue(t, n, `autoconfig_engine_admission_refusals_total{route="`+RouteName(r)+`",reason="`+reason+`"}`))
			sum += v
		}
		if sum > 0 {
			res.refused[reason] = strconv.Itoa(sum)
		}
	}
	t.Logf("burst of %d on %d route(s) at zero: %v", burstSize, len(routes), res)
	for k, v := range res.counts {
		if k != "200" && k != "503" {
			t.Errorf("%d requests answered %s (e.g. %q), want only 200 or 503 with Retry-After", v, k, notes[k])
		}
	}
	if res.counts["200"] != res.held {
		t.Errorf("%d answered 200, %d were held", res.counts["200"], res.held)
	}
	if l := n.ErrorLog(); strings.Contains(l, "worker_connections are not enough") {
		t.Errorf("nginx ran out of connections: %s", firstLine(l, "worker_connections are not enough"))
	}
	return res
}

func firstLine(log, s string) string {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// zeroRoutes are n scale-to-zero routes z0, z1, … with values.
func zeroRoutes(n int, values map[string]string) []*Route {
	var out []*Route
	for i := range n {
		out = append(out, holdRoute(fmt.Sprintf("z%d", i), "30s", values))
	}
	return out
}

// TestNginxHoldBurst: bursts of 5,000 requests to routes at zero on the
// shipped nginx.conf (two workers): the default hold_max, a raised
// hold_max (10,000) on one route and on several, and the engine's bound
// refusing the excess at once. Only 200 and 503 with Retry-After; every
// held request is served by the pod; a served route answers during the
// burst.
func TestNginxHoldBurst(t *testing.T) {
	raiseNofile(t, 3*burstSize)
	start := func(t *testing.T, replace ...[2]string) *nginxtest.Nginx {
		return nginxtest.Start(t, nginxtest.Options{Reference: true, Workers: 2, Replace: replace})
	}
	t.Run("default hold_max", func(t *testing.T) {
		res := burst(t, start(t), zeroRoutes(1, nil), 1)
		if res.held != 256 || res.refused["hold_full"] == "" {
			t.Errorf("held %d (refusals %v), want the default hold_max 256 and the rest refused hold_full", res.held, res.refused)
		}
	})
	t.Run("hold_max 10000", func(t *testing.T) {
		res := burst(t, start(t), zeroRoutes(1, map[string]string{"hold_max": "10000"}), 1)
		e := res.engine
		if e.Workers != 2 || e.Max != e.Workers*e.WorkerConnections/8 {
			t.Errorf("engine bound %+v, want 2 workers × worker_connections / 8", e)
		}
		if res.held < e.Max*3/4 || res.refused["hold_engine_full"] == "" {
			t.Errorf("%d of %d held with hold_max 10000 (refusals %v), want about the engine's bound %d and the rest refused hold_engine_full", res.held, burstSize, res.refused, e.Max)
		}
	})
	t.Run("several routes, the engine's bound", func(t *testing.T) {
		// 20 routes at zero with hold_max 10000: the engine's bound (set
		// to 1,000 by the init option hold_engine_max) refuses the rest.
		n := start(t, [2]string{"worker_connections = 16384 ", "worker_connections = 16384, hold_engine_max = 1000 "})
		res := burst(t, n, zeroRoutes(20, map[string]string{"hold_max": "10000"}), 1)
		if res.engine.Max != 1000 || res.held != 1000 || res.refused["hold_engine_full"] == "" {
			t.Errorf("held %d of the engine's bound %d (refusals %v), want 1000 held and the rest refused hold_engine_full", res.held, res.engine.Max, res.refused)
		}
	})
	t.Run("worker_connections 4096, default hold_max on 20 routes", func(t *testing.T) {
		// The former shipped worker_connections: 20 routes × 256 exceed
		// the derived bound, 2 × 4096 / 8 = 1,024. The requests come
		// in 25 waves of 200: requests in flight at once each take 3
		// connections before they are held or refused, and 5,000 at once
		// would exceed 2 × 4,096 by themselves (the shipped 16,384 take
		// them, the subtests above).
		n := start(t, [2]string{"    worker_connections 16384;", "    worker_connections 4096;"},
			[2]string{"worker_connections = 16384 ", "worker_connections = 4096 "})
		res := burst(t, n, zeroRoutes(20, nil), 25)
		if res.engine.Max != 1024 || res.held > 1024 || res.refused["hold_engine_full"] == "" {
			t.Errorf("held %d of the engine's bound %d (refusals %v), want at most 1024 and refusals hold_engine_full", res.held, res.engine.Max, res.refused)
		}
	})
}

// TestReferenceConfHoldBudget: the shipped nginx.conf tells the engine its
// events{} worker_connections (the init option the engine's bound of held
// requests is derived from), gives the workers a descriptor for each
// connection, and declares the engine's dict autoconfig@hold.
func TestReferenceConfHoldBudget(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(nginxtest.RepoDir(), "deploy", "openresty", "nginx.conf"))
	if err != nil {
		t.Fatal(err)
	}
	conf := string(b)
	num := func(pattern string) int {
		t.Helper()
		m := regexp.MustCompile(pattern).FindAllStringSubmatch(conf, -1)
		if len(m) != 1 {
			t.Fatalf("nginx.conf: %d matches of %s, want 1", len(m), pattern)
		}
		v, _ := strconv.Atoi(m[0][1])
		return v
	}
	events := num(`(?m)^\s*worker_connections (\d+);`)
	option := num(`worker_connections = (\d+)`)
	nofile := num(`(?m)^worker_rlimit_nofile (\d+);`)
	if option != events {
		t.Errorf("init option worker_connections = %d, events{} worker_connections %d: keep them equal", option, events)
	}
	if nofile < events+1024 {
		t.Errorf("worker_rlimit_nofile %d leaves too few descriptors for worker_connections %d", nofile, events)
	}
	if !regexp.MustCompile(`(?m)^\s*lua_shared_dict autoconfig@hold \d+[km];`).MatchString(conf) {
		t.Error("nginx.conf declares no lua_shared_dict autoconfig@hold")
	}
}

// TestNginxDispatchFailed: the dispatch server's own 502 on the shipped
// nginx.conf. A route whose socket exists but takes no connection (here:
// bound, never listening: connect() is refused, as it fails with EAGAIN
// when a burst fills the listen queue) is answered 503 with Retry-After
// and counted as the refusal dispatch_busy; an unknown route (no socket)
// stays 502.
func TestNginxDispatchFailed(t *testing.T) {
	n := startDynamic(t)
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: n.SockPath("deaf")}); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(n.URL("deaf")+"v1/chat/completions", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("a route socket taking no connection: %d Retry-After %q %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if got := metricValue(t, n, `autoconfig_engine_admission_refusals_total{route="deaf",reason="dispatch_busy"}`); got != "1" {
		t.Errorf("dispatch_busy refusals %q, want 1", got)
	}
	if code, body := nginxtest.Get(t, n.URL("nosuch")+"v1/models"); code != 502 {
		t.Errorf("an unknown route: %d %q, want 502", code, body)
	}
}
