package compiler

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// The property every route must have: if the schema (autoconfig vet)
// accepts it, the compiler renders it and the consumer loads it: nginx -t
// passes, the reload takes it, and a request through the route gets no 5xx
// from configuration or lua. TestPropertyAcceptedRoutesLoad checks it on
// routes generated from the schema's own constraints (each field's
// boundary values, random strings of a hostile alphabet, maximum sizes),
// keeping those vet accepts; FuzzAcceptedRouteLoads lets the fuzzer pick
// the generator's choices (make fuzz). Every route that ever failed is kept
// in testdata/routes/property/ (accepted routes) or testdata/routes/invalid/ (routes the schema now rejects), and the kept ones are checked first.

// propertyEnv reads an integer knob (AUTOCONFIG_PROPERTY_N, _SEED).
func propertyEnv(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return def
}

// hostile is the alphabet random strings are drawn from: the bytes that
// end or extend nginx and lua tokens, multi-byte UTF-8, BOM, separators.
var hostile = []string{"a", "Z", "0", "-", "_", ".", "/", " ", "\t", "\n", "\r", "\"", "'", "\\", "{", "}", ";", "#", "$", "[", "]", "[[", "]]", "=", "--", "%", "\x00", "\x7f", "é", "\u2028", "\ufeff", "\U0001F600", "\\u0041", "${x}", "$(id)", ",", "*", "~"}

func randString(r *rand.Rand, maxLen int) string {
	n := r.IntN(maxLen + 1)
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(hostile[r.IntN(len(hostile))])
	}
	return b.String()
}

// pick returns one of the values, or a random hostile string 1 time in 8.
func pick(r *rand.Rand, vals ...string) string {
	if r.IntN(8) == 0 {
		return randString(r, 24)
	}
	return vals[r.IntN(len(vals))]
}

// lengthAt returns a string of a boundary length made of one repeated
// piece (plain, or escaping to four times its size in lua).
func lengthAt(r *rand.Rand) string {
	n := []int{0, 1, 511, 512, 1023, 1024, 2045, 2046, 2047, 4095, 4096, 4097}[r.IntN(12)]
	return strings.Repeat([]string{"x", "\"", "é"}[r.IntN(3)], n)
}

// genRoute builds one route document from the generator's choices.
func genRoute(r *rand.Rand, i int) map[string]any {
	video := r.IntN(3) == 0
	name := fmt.Sprintf("p%d", i)
	nginx := map[string]any{"outputConfigMap": "openresty-conf"}
	if r.IntN(6) == 0 {
		nginx["route"] = pick(r, ".", "..", "...", "a.b", "_x", "-", strings.Repeat("r", 63), strings.Repeat("r", 64), name+"-x")
	}
	spec := map[string]any{"discovery": map[string]any{"service": "svc"}, "nginx": nginx}
	values := map[string]any{}
	var peers []any
	probe := func() string {
		return pick(r, "/", "/health", "/"+lengthAt(r), "/"+randString(r, 40), "relative")
	}
	if video {
		spec["modelType"] = "video"
		opt := func(k string, vals ...string) {
			if r.IntN(2) == 0 {
				values[k] = pick(r, vals...)
			}
		}
		opt("max_body_size", "0", "1", "64m", "999999999g", "1000000000g", "8589934592g", "1t", "1.5m")
		opt("proxy_timeout", "0", "0s", "1", "3600s", "1h30m", "1d2h3m4s5ms", "1s1s", "1m1h", "999999999d", "1h0m", "1y")
		opt("connect_timeout", "10s", "75s", "1", "999999999ms", "0s", "0", "05s")
		opt("rate_limit", "200Mbps", "1.5Gbps", "0.1Kbps", "999999999Gbps", "999999999.999999999Gbps", "1bps", "7", "25m", "1g", "0", "1Tbps")
		opt("rate_limit_after", "0", "1m", "512k", "999999999m", "1g", "999999999")
		opt("upload_conn_limit", "1", "65535", "65536", "0", "999999999")
		opt("upload_req_limit", "1r/s", "999999999r/m", "10r/h", "0r/s")
		opt("upload_req_burst", "0", "999999999", "5")
		opt("upload_limit_key", "$http_x_real_ip", "$binary_remote_addr", "$cookie_sid", "$arg_k", "$no_such_variable", "$host", "$request_uri", "$http_"+strings.Repeat("x", 64))
		opt("api_keys", "sk-1", "sk-1,sk-2", strings.Repeat("k", 4096), strings.Repeat("\"", 4096), "a,,b", "a b", "sk-"+lengthAt(r))
		opt("auth_public_paths", "", "~^/v2/x$", "~*(", "/exact", "~"+randString(r, 30), randString(r, 30))
		for _, u := range []string{"backend", "backend-svc"} {
			if r.IntN(3) > 0 {
				peers = append(peers, map[string]any{"use": u, "priority": r.IntN(1001)})
			}
		}
	} else {
		if r.IntN(2) == 0 {
			spec["cart"] = map[string]any{"service": "cart", "outputConfigMap": "cart", "maxLoad": []int{1, 20, 1000000}[r.IntN(3)]}
		}
		if r.IntN(3) == 0 {
			spec["failureMode"] = []string{"FailOpen", "FailClose"}[r.IntN(2)]
		}
		for _, u := range []string{"cart", "backend", "backend-svc"} {
			if r.IntN(3) == 0 {
				continue
			}
			p := map[string]any{"use": u, "priority": r.IntN(1001)}
			if r.IntN(2) == 0 {
				p["maxConcurrency"] = []int{1, 100, 1000000}[r.IntN(3)]
			}
			if r.IntN(3) == 0 {
				p["probePath"] = probe()
			}
			peers = append(peers, p)
		}
		for range r.IntN(6) {
			values[pick(r, "k", strings.Repeat("k", 63), strings.Repeat("k", 64), "_x", "a.b-c", "9x")] = lengthAt(r)
		}
		opt := func(k string, vals ...string) {
			if r.IntN(3) == 0 {
				values[k] = pick(r, vals...)
			}
		}
		opt("shared_dict_size", "8k", "7k", "1", "8192", "10m", "16g", "17g", "16384m", "16385m", "99999999999k")
		opt("default_max", "0", "1", "-1", "abc", "99999999999", "1e9")
		opt("max_tries", "0", "1", "4", "-3", "nan", "1e308")
		opt("health_probe_path", "/", "/x", "relative", "")
		opt("eject_consecutive_connect_failures", "0", "3", "-1", "x")
		opt("max_ejection_percent", "0", "100", "101", "-5")
		opt("ejection_seconds", "0", "1", "-1", "1e9")
		opt("health_probe_interval_seconds", "0", "0.001", "1", "-1", "x")
		opt("retry_on", "connect-failure", "never", "")
		opt("ttft_limit_ms", "1", "0", "x")
		if r.IntN(4) == 0 {
			spec["slo"] = map[string]any{"decodeTokensPerSecond": []int{1, 30, 100000}[r.IntN(3)]}
		}
	}
	nginx["peers"] = peers
	if len(values) > 0 {
		nginx["values"] = values
	}
	return map[string]any{
		"apiVersion": "routing.modelsphere.dev/v1alpha1",
		"kind":       "ModelRoute",
		"metadata":   map[string]any{"name": name, "namespace": "prop"},
		"spec":       spec,
	}
}

// propertyCheck holds the real consumer the routes are loaded into.
type propertyCheck struct {
	t     *testing.T
	v     *schema.Validator
	n     *nginxtest.Nginx
	be    *backend
	snap  Snapshot
	names map[string]bool
	// checked counts the accepted routes loaded; rejected the others.
	checked, rejected int
	// loaded are the routes whose files are in the nginx, oldest first.
	loaded []*Route
}

// maxShared is how many route files the property test keeps loaded at
// once (about what one shared ConfigMap holds).
const maxShared = 300

func newPropertyCheck(t *testing.T) *propertyCheck {
	v, err := schema.Default()
	if err != nil {
		t.Fatal(err)
	}
	n := startNginx(t)
	be := newBackend(t, text("ok"))
	return &propertyCheck{t: t, v: v, n: n, be: be, names: map[string]bool{},
		snap: Snapshot{Backends: []Endpoint{be.endpoint(t)}, BackendService: be.vip(t), CartService: be.vip(t)}}
}

// accept returns the route if vet accepts src (and its route name is new
// to this nginx), else nil.
func (p *propertyCheck) accept(name string, src []byte) *Route {
	obj, err := p.v.Validate(name, src)
	if err != nil {
		if strings.Contains(err.Error(), "the YAML decoder failed") {
			p.t.Logf("vet could not parse %s (%v):\n%s", name, err, src)
		}
		p.rejected++
		return nil
	}
	route := &Route{Name: obj.Name, Namespace: obj.Namespace, Spec: obj.Spec}
	if p.names[RouteName(route)] {
		return nil
	}
	p.names[RouteName(route)] = true
	return route
}

// load installs the routes together, reloads and requests each one; a
// failure names the route's source.
func (p *propertyCheck) load(routes []*Route, srcs [][]byte) {
	t := p.t
	t.Helper()
	// Keep at most maxShared routes in the nginx, as many as a shared
	// ConfigMap holds: the oldest files go first.
	for len(p.loaded) > maxShared {
		if err := os.Remove(filepath.Join(p.n.RoutesDir(), RouteKey(p.loaded[0]))); err != nil {
			t.Fatal(err)
		}
		p.loaded = p.loaded[1:]
	}
	for i, route := range routes {
		res, err := Compile(route, normalized(p.snap), Options{SockDir: p.n.SockDir()})
		if err != nil {
			t.Errorf("accepted route does not compile: %v\n%s", err, srcs[i])
			continue
		}
		conf, err := res.Outputs[0].Render(nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(conf) > maxSpecFile {
			t.Errorf("accepted route renders %d bytes, over the documented %d:\n%s", len(conf), maxSpecFile, srcs[i])
		}
		if err := os.WriteFile(filepath.Join(p.n.RoutesDir(), res.Outputs[0].Key), conf, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.n.Test(); err != nil {
		t.Fatalf("nginx -t refuses accepted routes: %v\nroutes:\n%s", err, joinSrcs(srcs))
	}
	p.loaded = append(p.loaded, routes...)
	if err := p.n.Reload(); err != nil {
		t.Fatalf("reload: %v\nroutes:\n%s", err, joinSrcs(srcs))
	}
	for i, route := range routes {
		p.checked++
		name := RouteName(route)
		var code int
		var body string
		if route.Spec.ModelType == routespec.ModelTypeVideo {
			hdr := map[string]string{}
			if keys := route.Spec.Nginx.Values["api_keys"]; keys != "" {
				hdr["Authorization"] = "Bearer " + strings.Split(keys, ",")[0]
			}
			code, body, _ = do(t, nil, "GET", p.n.URL(name)+"v2/video_generation", hdr, "")
		} else {
			code, body, _ = do(t, nil, "POST", p.n.URL(name)+"v1/chat/completions", nil, "{}")
		}
		if code >= 500 {
			t.Errorf("route %s answers %d %.200q\n%s\nerror log:\n%s", name, code, body, srcs[i], tail(p.n.ErrorLog(), 2000))
		}
	}
}

func joinSrcs(srcs [][]byte) string {
	var b strings.Builder
	for _, s := range srcs {
		b.WriteString("---\n")
		b.Write(s)
	}
	return b.String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// TestPropertyAcceptedRoutesLoad: the kept failures first, then
// AUTOCONFIG_PROPERTY_N (default 150) accepted routes from seed
// AUTOCONFIG_PROPERTY_SEED (default 1), loaded 30 at a time.
func TestPropertyAcceptedRoutesLoad(t *testing.T) {
	p := newPropertyCheck(t)
	files, _ := filepath.Glob(filepath.Join(testbin.Root(t), "testdata", "routes", "property", "*.yaml"))
	var routes []*Route
	var srcs [][]byte
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if route := p.accept(f, src); route != nil {
			routes, srcs = append(routes, route), append(srcs, src)
		}
	}
	p.load(routes, srcs)
	want := propertyEnv("AUTOCONFIG_PROPERTY_N", 150)
	seed := uint64(propertyEnv("AUTOCONFIG_PROPERTY_SEED", 1))
	r := rand.New(rand.NewPCG(seed, 0))
	routes, srcs = nil, nil
	for i := 0; p.checked < want+len(files) && i < want*20 && !t.Failed(); i++ {
		src, err := yaml.Marshal(genRoute(r, i))
		if err != nil {
			t.Fatal(err)
		}
		if route := p.accept(fmt.Sprintf("generated-%d.yaml", i), src); route != nil {
			routes, srcs = append(routes, route), append(srcs, src)
		}
		if len(routes) == 30 {
			p.load(routes, srcs)
			routes, srcs = nil, nil
		}
	}
	p.load(routes, srcs)
	t.Logf("seed %d: %d accepted routes loaded into real nginx and answered without a 5xx; %d generated routes rejected by vet", seed, p.checked, p.rejected)
	if p.checked < want {
		t.Errorf("only %d accepted routes in %d tries", p.checked, want*20)
	}
}

// FuzzAcceptedRouteLoads: the fuzzer chooses the generator's random
// stream; every accepted route must load (make fuzz).
func FuzzAcceptedRouteLoads(f *testing.F) {
	for _, s := range []uint64{1, 2, 3, 42} {
		f.Add(s, s*7919)
	}
	f.Fuzz(func(t *testing.T, a, b uint64) {
		p := newPropertyCheck(t)
		r := rand.New(rand.NewPCG(a, b))
		var routes []*Route
		var srcs [][]byte
		for i := range 8 {
			src, err := yaml.Marshal(genRoute(r, i))
			if err != nil {
				t.Fatal(err)
			}
			if route := p.accept(fmt.Sprintf("fuzz-%d.yaml", i), src); route != nil {
				routes, srcs = append(routes, route), append(srcs, src)
			}
		}
		p.load(routes, srcs)
	})
}

// maxSpecFile bounds the part of a route file the spec decides (docs:
// "Limits a route's values are held to"): the schema's limits (values at
// most 16384 bytes, probe paths at most 1024 characters) keep it under
// this, whatever the bytes; endpoints add to it.
const maxSpecFile = 96 << 10

// TestWorstCaseRouteFile renders a route at every limit the schema
// allows, with bytes that escape to four times their size, checks it stays
// under maxSpecFile and loads in real nginx.
func TestWorstCaseRouteFile(t *testing.T) {
	v, err := schema.Default()
	if err != nil {
		t.Fatal(err)
	}
	probe := "/" + strings.Repeat(`\"`, 1023)
	var vals strings.Builder
	for i := range 4 {
		fmt.Fprintf(&vals, "      %d: \"%s\"\n", i, strings.Repeat(`\"`, 4095))
	}
	src := fmt.Sprintf(`apiVersion: routing.modelsphere.dev/v1alpha1
kind: ModelRoute
metadata: {name: worst, namespace: prop}
spec:
  discovery: {service: svc}
  cart: {service: cart, outputConfigMap: cart}
  failureMode: FailOpen
  nginx:
    outputConfigMap: openresty-conf
    peers:
    - {use: cart, priority: 3, probePath: "%[1]s"}
    - {use: backend, priority: 2, probePath: "%[1]s"}
    - {use: backend-svc, priority: 1, probePath: "%[1]s"}
    values:
%[2]s`, probe, vals.String())
	src = strings.ReplaceAll(src, "      0:", "      a:")
	src = strings.ReplaceAll(src, "      1:", "      b:")
	src = strings.ReplaceAll(src, "      2:", "      c:")
	src = strings.ReplaceAll(src, "      3:", "      d:")
	obj, err := v.Validate("worst.yaml", []byte(src))
	if err != nil {
		t.Fatalf("the worst case is not valid: %v", err)
	}
	p := newPropertyCheck(t)
	route := &Route{Name: obj.Name, Namespace: obj.Namespace, Spec: obj.Spec}
	res, err := Compile(route, normalized(p.snap), Options{SockDir: p.n.SockDir()})
	if err != nil {
		t.Fatal(err)
	}
	conf, _ := res.Outputs[0].Render(nil)
	t.Logf("route file at the schema's limits: %d bytes (%.1f KiB) with one backend; a 1 MiB ConfigMap holds %d of them", len(conf), float64(len(conf))/1024, (1<<20)/len(conf))
	if len(conf) > maxSpecFile {
		t.Errorf("route file %d bytes, over %d", len(conf), maxSpecFile)
	}
	p.load([]*Route{route}, [][]byte{[]byte(src)})
}
