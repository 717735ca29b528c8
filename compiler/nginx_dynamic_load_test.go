package compiler

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// TestNginxLoadsDynamicRoutes installs every corpus route (samples, valid
// and property routes) rendered with Options.DynamicPeers, with failureMode
// as written, FailOpen and FailClose, into one real nginx: nginx -t accepts
// the files and a reload takes them (the routes share one http{}: dict,
// zone, map and upstream names must not collide). Each peers key is
// written next to its route file, as the ConfigMap mount holds it (the
// include takes only *.conf). No request is sent: the engine's dynamic
// registration is the reference engine's part (router.lua).
func TestNginxLoadsDynamicRoutes(t *testing.T) {
	root := testbin.Root(t)
	v, err := schema.Default()
	if err != nil {
		t.Fatal(err)
	}
	_, _, _, snap, _ := goldenInputs(t)
	n := startNginx(t)
	var files []string
	for _, dir := range []string{"deploy/samples", "testdata/routes/valid", "testdata/routes/property"} {
		m, _ := filepath.Glob(filepath.Join(root, dir, "*.yaml"))
		files = append(files, m...)
	}
	var routes []*Route
	for _, f := range files {
		obj := validRoute(t, v, f, f)
		for _, mode := range []string{"", routespec.FailOpen, routespec.FailClose} {
			r := &Route{Name: obj.Name, Namespace: obj.Namespace, Spec: *obj.Spec.DeepCopy()}
			if mode != "" {
				r.Spec.FailureMode = mode
			}
			routes = append(routes, r)
		}
	}
	loaded := 0
	for round := 1; len(routes) > 0; round++ {
		seen := map[string]bool{}
		var later []*Route
		for _, r := range routes {
			if seen[RouteName(r)] {
				later = append(later, r)
				continue
			}
			seen[RouteName(r)] = true
			res, err := Compile(r, snap, Options{SockDir: n.SockDir(), DynamicPeers: true})
			if err != nil {
				t.Fatalf("%s (%s): %v", r.Name, r.Spec.FailureMode, err)
			}
			for _, o := range res.Outputs[:2] {
				if err := os.WriteFile(filepath.Join(n.RoutesDir(), o.Key), render(t, o), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			loaded++
		}
		if err := n.Test(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if err := n.Reload(); err != nil {
			t.Fatalf("round %d: %v\n%s", round, err, tail(n.ErrorLog(), 3000))
		}
		routes = later
	}
	if loaded < 3*len(files) {
		t.Fatalf("loaded %d renders of %d files", loaded, len(files))
	}
	if code, _ := nginxtest.Get(t, "http://"+n.Addr()+"/_nginxtest/health"); code != 200 {
		t.Fatalf("nginx health after the reloads: %d", code)
	}
}

// stubRouter is a stand-in for the engine, to run the lua a dynamic route
// file holds (nginx -t compiles none of it) without the reference
// engine's dynamic peers: it records the registration (options as hex, so
// any byte reads back) and counts the calls of each phase; balance sends
// every try to one address; GET …/stub-state (after the prefix strip)
// returns what it recorded for the route.
const stubRouter = `local cjson = require("cjson.safe")
local balancer = require("ngx.balancer")
local M = {}
local reg, counts = {}, {}
local function count(route, what)
  counts[route] = counts[route] or {}
  counts[route][what] = (counts[route][what] or 0) + 1
end
local function hex(s)
  return (s:gsub(".", function(c) return string.format("%%02x", c:byte()) end))
end
function M.registered(route) return reg[route] ~= nil end
function M.register_route() error("register_route called by a dynamic route file") end
function M.register_dynamic_route(route, options, extra)
  if extra ~= nil then error("register_dynamic_route got tiers") end
  local o = {}
  for k, v in pairs(options) do o[hex(k)] = hex(v) end
  reg[route] = o
  count(route, "register")
end
function M.access(route)
  count(route, "access")
  if ngx.var.uri == "/stub-state" then
    ngx.header["Content-Type"] = "application/json"
    ngx.say(cjson.encode({options = reg[route], counts = counts[route]}))
    return ngx.exit(200)
  end
end
function M.balance(route)
  count(route, "balance")
  local ok, err = balancer.set_current_peer(%q, %d)
  if not ok then error(err) end
end
function M.log(route) count(route, "log") end
return M
`

// stubState is what the stub recorded for a route.
type stubState struct {
	Options map[string]string `json:"options"`
	Counts  map[string]int    `json:"counts"`
}

func getStubState(t *testing.T, url string, hdr map[string]string) stubState {
	t.Helper()
	code, body, _ := do(t, nil, "GET", url+"stub-state", hdr, "")
	var st stubState
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
		t.Fatalf("GET stub-state: %d %s (%v)", code, body, err)
	}
	return st
}

func hexOptions(opts [][2]string) map[string]string {
	out := map[string]string{}
	for _, kv := range opts {
		out[hex.EncodeToString([]byte(kv[0]))] = hex.EncodeToString([]byte(kv[1]))
	}
	return out
}

// TestNginxDynamicRouteLua runs the lua of dynamic route files in a real
// nginx against a stub engine (stubRouter): the llm file registers once
// with register_dynamic_route and exactly its options (no tiers), admits,
// proxies through the balancer with the /<route> prefix stripped; the
// video file checks the API key first (a refused request never reaches
// the registration or the engine's access), then registers with the video
// options, and its upstream is the engine's balancer.
func TestNginxDynamicRouteLua(t *testing.T) {
	be := newBackend(t, text("ok"))
	host, port := hostPort(t, be.Listener.Addr().String())
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "router.lua"), fmt.Appendf(nil, stubRouter, host, port), 0o644); err != nil {
		t.Fatal(err)
	}
	n := nginxtest.Start(t, nginxtest.Options{LuaPackagePath: filepath.Join(dir, "?.lua")})
	routes := dynamicRoutes()
	llm, video, open := routes[0], routes[2], routes[3]
	llm.Spec.FailureMode = routespec.FailOpen
	snap := Snapshot{Backends: []Endpoint{{IP: "10.0.0.1", Port: 8000}}, BackendService: &ServiceVIP{IP: "10.96.0.10", Port: 8000}, CartService: &ServiceVIP{IP: "10.96.0.20", Port: 9000}}
	for _, r := range []*Route{llm, video, open} {
		res, err := Compile(r, snap, Options{SockDir: n.SockDir(), DynamicPeers: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(n.RoutesDir(), res.Outputs[0].Key), render(t, res.Outputs[0]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Test(); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}

	t.Run("llm", func(t *testing.T) {
		url := n.URL("dyn")
		if code, body, _ := do(t, nil, "GET", url+"v2/models?x=1", nil, ""); code != 200 || body != "ok" {
			t.Fatalf("proxied request: %d %q", code, body)
		}
		if got := be.last().URL.RequestURI(); got != "/v2/models?x=1" {
			t.Errorf("backend saw %q", got)
		}
		st := getStubState(t, url, nil)
		c := compilation{route: llm, name: "dyn", res: &Result{}}
		if want := hexOptions(c.llmOptions()); !reflect.DeepEqual(st.Options, want) {
			t.Errorf("options\n got %v\nwant %v", st.Options, want)
		}
		if st.Counts["register"] != 1 || st.Counts["access"] != 2 || st.Counts["balance"] != 1 {
			t.Errorf("calls %v, want one registration, two accesses, one balance", st.Counts)
		}
	})

	t.Run("video api keys", func(t *testing.T) {
		url := n.URL("dyn-video")
		code, _, hdr := do(t, nil, "GET", url+"v2/videos", nil, "")
		if code != 401 || hdr.Get("WWW-Authenticate") != "Bearer" {
			t.Fatalf("no key: %d %v, want 401 Bearer", code, hdr)
		}
		if code, body, _ := do(t, nil, "GET", url+"v2/video_generation/x/content", nil, ""); code != 200 || body != "ok" {
			t.Fatalf("public path without a key: %d %q", code, body)
		}
		key := map[string]string{"Authorization": "Bearer k2"}
		if code, body, _ := do(t, nil, "POST", url+"v2/videos", key, "{}"); code != 200 || body != "ok" {
			t.Fatalf("with a key: %d %q", code, body)
		}
		if got := be.last().URL.Path; got != "/v2/videos" {
			t.Errorf("backend saw %q", got)
		}
		st := getStubState(t, url, map[string]string{"Authorization": "Bearer k1"})
		if want := hexOptions(videoDynamicOptions); !reflect.DeepEqual(st.Options, want) {
			t.Errorf("options\n got %v\nwant %v", st.Options, want)
		}
		// The refused request reached neither the registration nor access.
		if st.Counts["register"] != 1 || st.Counts["access"] != 3 || st.Counts["balance"] != 2 {
			t.Errorf("calls %v, want one registration, three accesses, two balances", st.Counts)
		}
	})

	t.Run("video without keys", func(t *testing.T) {
		url := n.URL("dyn-video-sel")
		if code, body, _ := do(t, nil, "GET", url+"v2/videos", nil, ""); code != 200 || body != "ok" {
			t.Fatalf("%d %q", code, body)
		}
		st := getStubState(t, url, nil)
		if st.Counts["register"] != 1 || st.Counts["access"] != 2 || st.Counts["balance"] != 1 {
			t.Errorf("calls %v", st.Counts)
		}
	})
	if t.Failed() {
		t.Log(tail(n.ErrorLog(), 3000))
	}
}
