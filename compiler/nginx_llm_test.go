package compiler

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// hostileStrings break naive escaping in lua, in nginx's lexer, or both.
var hostileStrings = []string{
	``, `"`, `'`, `\`, `\\`, `\"`, `"]]`, `]]`, `[[`, `[=[`, `]=]`, `[==[x]==]`,
	`;`, `}`, `{`, `};`, `}}}`, `#`, `# comment`, `$`, `$host`, `${x}`,
	"\n", "\r\n", "\nserver { listen 80; }\n", "\x00", "a\x00b", "\xff\xfe", "\xc3\x28", "\xed\xa0\x80",
	`--`, `--[[`, `") os.exit(1) --`, "\t\v\f", `\u0041`, `\x41`, `\065`, `%s%n`, `ngx.exit(500)`,
	`}" ; return 200 "pwned`, "naïve ✓", `end`, `0`, `1e9`,
}

// allBytes is every byte value once.
func allBytes() string {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return string(b)
}

// randomHostile makes n strings glued from hostile pieces and random bytes,
// from a fixed seed (reproducible).
func randomHostile(seed uint64, n int) []string {
	r := rand.New(rand.NewPCG(seed, 42))
	out := make([]string, n)
	for i := range out {
		var sb strings.Builder
		for j := r.IntN(8); j >= 0; j-- {
			if r.IntN(3) == 0 {
				sb.WriteByte(byte(r.IntN(256)))
			} else {
				sb.WriteString(hostileStrings[r.IntN(len(hostileStrings))])
			}
		}
		out[i] = sb.String()
	}
	return out
}

// unhexJSON decodes the engine's hex-encoded JSON (GET _status?strings=hex) back into Go values:
// strings and map keys from hex, numbers as float64.
func unhexJSON(t *testing.T, v any) any {
	t.Helper()
	switch x := v.(type) {
	case string:
		b, err := hex.DecodeString(x)
		if err != nil {
			t.Fatalf("engine sent non-hex string %q", x)
		}
		return string(b)
	case []any:
		for i := range x {
			x[i] = unhexJSON(t, x[i])
		}
		return x
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			kb, err := hex.DecodeString(k)
			if err != nil {
				t.Fatalf("engine sent non-hex key %q", k)
			}
			out[string(kb)] = unhexJSON(t, e)
		}
		return out
	}
	return v
}

// registered asks the engine (GET /<route>/_status?strings=hex, the
// reference router.lua's status endpoint) what the route registered.
func registered(t *testing.T, url string) (name string, options map[string]any, tiers []any, calls int) {
	t.Helper()
	resp, err := http.Get(url + "_status?strings=hex")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("GET _status: %d %s", resp.StatusCode, body)
	}
	var raw struct {
		Name    string         `json:"route"`
		Options map[string]any `json:"options"`
		Tiers   []any          `json:"tiers"`
		Calls   int            `json:"registrations"`
	}
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	name = unhexJSON(t, raw.Name).(string)
	options = unhexJSON(t, raw.Options).(map[string]any)
	tiers = unhexJSON(t, raw.Tiers).([]any)
	return name, options, tiers, raw.Calls
}

func peer(host string, port int32) map[string]any {
	return map[string]any{"host": host, "port": float64(port)}
}

// TestNginxLLMRegistration proves on a real nginx + lua that the route file
// loads, registers exactly the spec's options and ordered tiers once per
// worker, strips the /<route> prefix and proxies through the engine's
// balancer.
func TestNginxLLMRegistration(t *testing.T) {
	n := startNginx(t)
	var seen []string
	cart := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.URL.RequestURI()+" "+r.Header.Get("X-Real-IP"))
		fmt.Fprint(w, "cart ok")
	}))
	defer cart.Close()
	cartHost, cartPort := hostPort(t, cart.Listener.Addr().String())

	values := map[string]string{
		"tps_limit_tps":     "30",
		"default_max":       "64",
		"health_probe_path": "/v1/models",
		"quote":             `he said "hi"; } # $host ]]`,
	}
	r := llmRoute("qwen.v2", values,
		routespec.Peer{Use: "backend-svc", Priority: 1},
		routespec.Peer{Use: "cart", Priority: 3, MaxConcurrencyFromBackend: true},
		routespec.Peer{Use: "backend", Priority: 2, MaxConcurrency: 100, ProbePath: "/ping"},
	)
	r.Spec.Cart = &routespec.Cart{OutputConfigMap: "cart-conf", MaxLoad: 20}
	r.Spec.SLO = &routespec.SLO{TTFTMs: 2000, DecodeTokensPerSecond: 20}
	snap := Snapshot{
		Backends: []Endpoint{
			{IP: "10.0.0.12", Port: 8000}, {IP: "fd00::1", Port: 8000}, {IP: "10.0.0.3", Port: 8001},
		},
		BackendService: &ServiceVIP{IP: "10.96.0.10", Port: 8000},
		CartService:    &ServiceVIP{IP: cartHost, Port: cartPort},
	}
	install(t, n, r, snap)
	url := n.URL("qwen.v2")

	// A real request goes through the prefix strip and the balancer.
	for i := 0; i < 3; i++ {
		resp, err := http.Get(url + "v2/models?x=1")
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != 200 || body != "cart ok" {
			t.Fatalf("proxied request: %d %q", resp.StatusCode, body)
		}
	}
	if want := "/v2/models?x=1 127.0.0.1"; len(seen) != 3 || seen[0] != want {
		t.Fatalf("backend saw %q, want 3× %q", seen, want)
	}

	name, options, tiers, calls := registered(t, url)
	if name != "qwen.v2" {
		t.Errorf("route name %q", name)
	}
	wantOpts := map[string]any{}
	for k, v := range values {
		wantOpts[k] = v
	}
	wantOpts["ttft_limit_ms"], wantOpts["tps_limit_tps"] = "2000", "20"
	if !reflect.DeepEqual(options, wantOpts) {
		t.Errorf("options:\n got %#v\nwant %#v", options, wantOpts)
	}
	wantTiers := []any{
		map[string]any{"use": "cart", "priority": float64(3), "max_concurrency": float64(300), "probe_path": "/health",
			"peers": []any{peer(cartHost, cartPort)}},
		map[string]any{"use": "backend", "priority": float64(2), "max_concurrency": float64(100), "probe_path": "/ping",
			"peers": []any{peer("10.0.0.3", 8001), peer("10.0.0.12", 8000), peer("fd00::1", 8000)}},
		map[string]any{"use": "backend-svc", "priority": float64(1), "max_concurrency": float64(64), "probe_path": "/v1/models",
			"peers": []any{peer("10.96.0.10", 8000)}},
	}
	if !reflect.DeepEqual(tiers, wantTiers) {
		t.Errorf("tiers:\n got %#v\nwant %#v", tiers, wantTiers)
	}
	// One worker: register_route ran once for 4 requests.
	if calls != 1 {
		t.Errorf("register_route called %d times in one worker, want 1", calls)
	}
}

// TestNginxLLMHostileValues sends every byte value and a seeded set of
// hostile strings, as option keys and values, through a real nginx + lua:
// lua must read back exactly the original bytes.
func TestNginxLLMHostileValues(t *testing.T) {
	n := startNginx(t)
	values := map[string]string{"all_bytes": allBytes()}
	for i, s := range hostileStrings {
		values[fmt.Sprintf("h%02d", i)] = s
		values["k"+s] = s // hostile keys go through the same encoder
	}
	for i, s := range randomHostile(1, 200) {
		values[fmt.Sprintf("r%03d", i)] = s
	}
	r := llmRoute("hostile", values, routespec.Peer{Use: "backend", Priority: 2, ProbePath: "/" + allBytes()})
	install(t, n, r, Snapshot{Backends: []Endpoint{{IP: "10.0.0.1", Port: 8000}}})
	_, options, tiers, _ := registered(t, n.URL("hostile"))
	if len(options) != len(values) {
		t.Errorf("lua saw %d options, want %d", len(options), len(values))
	}
	for k, v := range values {
		if got, ok := options[k]; !ok || got != v {
			t.Errorf("option %q: lua read %q, want %q", k, got, v)
		}
	}
	if got := tiers[0].(map[string]any)["probe_path"]; got != "/"+allBytes() {
		t.Errorf("probe_path: lua read %q", got)
	}
}

// TestNginxLLMSharedDict proves on a real nginx that each llm route file
// declares the lua shared dict named as its route, at the size given by
// values.shared_dict_size (default 10m): two routes in one http{} load
// together and each has its own dict.
func TestNginxLLMSharedDict(t *testing.T) {
	port, err := nginxtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	// A probe server reads the dicts' capacities from lua.
	n := nginxtest.Start(t, nginxtest.Options{
		LuaPackagePath: nginxtest.RouterLuaPath(),
		HTTPConfig: fmt.Sprintf(`server {
        listen 127.0.0.1:%d;
        location = /dict {
            content_by_lua_block {
                local d = ngx.shared[ngx.var.arg_name]
                ngx.print(d and d:capacity() or "none")
            }
        }
    }`, port),
	})
	snap := Snapshot{Backends: []Endpoint{{IP: "10.0.0.1", Port: 8000}}}
	install(t, n, llmRoute("qwen", nil, routespec.Peer{Use: "backend", Priority: 2}), snap)
	install(t, n, llmRoute("llama.v3", map[string]string{SharedDictSizeKey: "512k"}, routespec.Peer{Use: "backend", Priority: 2}), snap)
	for name, want := range map[string]string{"qwen": "10485760", "llama.v3": "524288", "other": "none"} {
		if code, body := nginxtest.Get(t, fmt.Sprintf("http://127.0.0.1:%d/dict?name=%s", port, name)); code != 200 || body != want {
			t.Errorf("dict %q: %d %q, want capacity %s", name, code, body, want)
		}
	}
	// Both routes still serve.
	for _, route := range []string{"qwen", "llama.v3"} {
		if name, _, _, _ := registered(t, n.URL(route)); name != route {
			t.Errorf("route %q registered as %q", route, name)
		}
	}
}

// TestSharedDictSize: only the nginx size form, from 64k to 16g, reaches
// the lua_shared_dict line; anything else fails the route.
func TestSharedDictSize(t *testing.T) {
	snap := normalized(Snapshot{Backends: []Endpoint{{IP: "10.0.0.1", Port: 8000}}})
	for _, ok := range []string{"64k", "65536", "10m", "512K", "1024m", "16384m", "17179869184"} {
		res, err := Compile(llmRoute("r", map[string]string{SharedDictSizeKey: ok}, routespec.Peer{Use: "backend", Priority: 2}), snap, Options{})
		if err != nil {
			t.Errorf("%q: %v", ok, err)
			continue
		}
		if conf, _ := res.Outputs[0].Render(nil); !strings.Contains(string(conf), "\nlua_shared_dict r "+ok+";\n") {
			t.Errorf("%q: no dict line in\n%s", ok, conf)
		}
	}
	for _, bad := range []string{"", "0", "7k", "8k", "63k", "65535", "010m", "1g", "16g", "17g", "16385m", "99999999999g", "10 m", "10m;", "10m; include /etc/passwd", "1.5m", "-1m", "10mb", "m"} {
		if _, err := Compile(llmRoute("r", map[string]string{SharedDictSizeKey: bad}, routespec.Peer{Use: "backend", Priority: 2}), snap, Options{}); err == nil || !strings.Contains(err.Error(), SharedDictSizeKey) {
			t.Errorf("%q: err %v, want a shared_dict_size error", bad, err)
		}
	}
}

// TestNginxLLMTuningInPodOnly proves through the dispatch server that the
// route's engine endpoints (/<route>/_…) answer only in-pod callers: the
// dispatch passes the client address as X-Real-IP, the route server
// restores it, allow/deny sees it. Normal paths answer everyone.
func TestNginxLLMTuningInPodOnly(t *testing.T) {
	n := startNginx(t)
	var seen []string
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.URL.RequestURI()+" "+r.Header.Get("X-Real-IP"))
		fmt.Fprint(w, "backend ok")
	}))
	defer backend.Close()
	host, port := hostPort(t, backend.Listener.Addr().String())
	install(t, n, llmRoute("tune.v1", nil, routespec.Peer{Use: "backend", Priority: 2}),
		Snapshot{Backends: []Endpoint{{IP: host, Port: port}}})
	url := n.URL("tune.v1")

	// An outside client: the dispatch sees 127.0.0.2 (any 127/8 address
	// is local on Linux, so a second client address needs no network).
	outside := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)},
	}).DialContext}}
	get := func(c *http.Client, u string, hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", u, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, readAll(t, resp)
	}

	// In-pod (127.0.0.1): the engine answers its endpoint.
	if code, body := get(http.DefaultClient, url+"_status", nil); code != 200 || !strings.Contains(body, `"registrations"`) {
		t.Errorf("in-pod _status: %d %q", code, body)
	}
	// Outside: 403, also with a forged X-Real-IP (the dispatch overwrites it)
	// and for any /_ path, before the engine or a backend sees it.
	for _, p := range []string{"_status", "_tps_status", "_status?strings=hex", "_"} {
		for _, hdr := range []map[string]string{nil, {"X-Real-IP": "127.0.0.1"}} {
			if code, _ := get(outside, url+p, hdr); code != 403 {
				t.Errorf("outside %s %v: %d, want 403", p, hdr, code)
			}
		}
	}
	// Normal traffic from outside is unaffected, and so are paths with an
	// '_' further in.
	seen = nil
	for _, p := range []string{"v1/models", "v1/_x", "v1/chat?q=/_tps_status", "a_b"} {
		if code, body := get(outside, url+p, nil); code != 200 || body != "backend ok" {
			t.Errorf("outside %s: %d %q", p, code, body)
		}
	}
	want := []string{"/v1/models 127.0.0.2", "/v1/_x 127.0.0.2", "/v1/chat?q=/_tps_status 127.0.0.2", "/a_b 127.0.0.2"}
	if !reflect.DeepEqual(seen, want) {
		t.Errorf("backend saw %q, want %q", seen, want)
	}
	// An in-pod /_ path the engine does not answer still reaches the
	// backends, as before.
	seen = nil
	if code, body := get(http.DefaultClient, url+"_other", nil); code != 200 || body != "backend ok" || len(seen) != 1 || seen[0] != "/_other 127.0.0.1" {
		t.Errorf("in-pod _other: %d %q, backend saw %q", code, body, seen)
	}
}
