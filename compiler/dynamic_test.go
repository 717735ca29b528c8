package compiler

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// dynamicSnapshots are one route's endpoints over time: scale out and in,
// every pod replaced, IPv6 only, other ports, the CART and backend Service
// VIPs present or not, CART and nginx pods. Each is in normal form.
func dynamicSnapshots() []struct {
	name string
	snap Snapshot
} {
	be := func(port int32, ips ...string) []Endpoint {
		out := make([]Endpoint, len(ips))
		for i, ip := range ips {
			out[i] = Endpoint{IP: ip, Port: port, Ready: true, GPUProduct: "NVIDIA-H100-80GB-HBM3"}
		}
		return out
	}
	var many []string
	for i := 1; i <= 40; i++ {
		many = append(many, fmt.Sprintf("10.0.%d.%d", i/8, i))
	}
	svc := &ServiceVIP{IP: "10.96.0.10", Port: 8000}
	cart := &ServiceVIP{IP: "10.96.0.20", Port: 9000}
	snaps := []struct {
		name string
		snap Snapshot
	}{
		{"three", Snapshot{Backends: be(8000, "10.0.0.1", "10.0.0.2", "10.0.0.3"), BackendService: svc, CartService: cart}},
		{"scaled out", Snapshot{Backends: be(8000, many...), BackendService: svc, CartService: cart}},
		{"scaled in", Snapshot{Backends: be(8000, "10.0.0.2"), BackendService: svc, CartService: cart}},
		{"replaced", Snapshot{Backends: be(8000, "10.0.9.7", "10.0.9.8", "10.0.9.9"), BackendService: svc, CartService: cart}},
		{"ipv6", Snapshot{Backends: be(8000, "fd00::1", "fd00::2"), BackendService: &ServiceVIP{IP: "fd00::100", Port: 8000}, CartService: &ServiceVIP{IP: "fd00::200", Port: 9000}}},
		{"dual stack", Snapshot{Backends: be(8000, "10.0.0.1", "fd00::1"), BackendService: svc, CartService: cart}},
		{"other port", Snapshot{Backends: be(9001, "10.0.0.1", "10.0.0.2", "10.0.0.3"), BackendService: &ServiceVIP{IP: "10.96.0.10", Port: 9001}, CartService: cart}},
		{"no VIPs", Snapshot{Backends: be(8000, "10.0.0.1", "10.0.0.2")}},
		{"backend-svc only", Snapshot{Backends: be(8000, "10.0.0.1", "10.0.0.2"), BackendService: svc}},
		{"cart only", Snapshot{Backends: be(8000, "10.0.0.1", "10.0.0.2"), CartService: cart}},
		{"other VIPs", Snapshot{Backends: be(8000, "10.0.0.1", "10.0.0.2", "10.0.0.3"), BackendService: &ServiceVIP{IP: "10.96.1.10", Port: 8000}, CartService: &ServiceVIP{IP: "10.96.1.20", Port: 9000}}},
		{"pods", Snapshot{Backends: be(8000, "10.0.0.1", "10.0.0.2", "10.0.0.3"), BackendService: svc, CartService: cart,
			CartPods: be(9000, "10.0.1.1", "10.0.1.2"), NginxPods: be(8080, "10.0.2.1")}},
	}
	for i := range snaps {
		snaps[i].snap = normalized(snaps[i].snap)
	}
	return snaps
}

// dynamicRoutes are an llm route with every tier kind (the cart tier's
// limit from the backend count, default_max, a probe path, CART and
// monitor outputs) and a video route with api_keys, limits and a rate
// limit, each also in selector mode.
func dynamicRoutes() []*Route {
	llm := llmRoute("dyn", map[string]string{"default_max": "16", "health_probe_path": "/v1/models", "tuning": `x"; } #`},
		routespec.Peer{Use: routespec.UseCart, Priority: 3, MaxConcurrencyFromBackend: true},
		routespec.Peer{Use: routespec.UseBackend, Priority: 2, MaxConcurrency: 4},
		routespec.Peer{Use: routespec.UseBackendSvc, Priority: 1})
	llm.Spec.Cart = &routespec.Cart{OutputConfigMap: "cart-conf", MaxLoad: 7}
	llm.Spec.Monitor = &routespec.Monitor{OutputConfigMap: "monitoring/mon"}
	llm.Spec.SLO = &routespec.SLO{TTFTMs: 1500}
	llmSel := llmRoute("dyn-sel", nil, routespec.Peer{Use: routespec.UseBackend, Priority: 2}, routespec.Peer{Use: routespec.UseBackendSvc, Priority: 1})
	llmSel.Spec.Discovery = routespec.Discovery{Selector: "app=dyn"}
	video := videoRoute("dyn-video", map[string]string{
		"api_keys": "k1,k2", "rate_limit": "200Mbps", "upload_conn_limit": "4", "upload_req_limit": "10r/s", "upload_req_burst": "20",
	}, routespec.Peer{Use: routespec.UseBackend, Priority: 2, MaxConcurrency: 3}, routespec.Peer{Use: routespec.UseBackendSvc, Priority: 1})
	videoSel := videoRoute("dyn-video-sel", nil, routespec.Peer{Use: routespec.UseBackend, Priority: 2}, routespec.Peer{Use: routespec.UseBackendSvc, Priority: 1})
	videoSel.Spec.Discovery = routespec.Discovery{Selector: "app=dyn"}
	return []*Route{llm, llmSel, video, videoSel}
}

// TestDynamicRouteFileIgnoresEndpoints is the point of dynamic peers: with
// Options.DynamicPeers a route's file is the same bytes whatever the
// endpoints (so an endpoint change needs no reload), and its peers table
// changes exactly when the static route file would. The table holds
// exactly the tiers the static render uses: the static route file
// rendered from the table's tiers is the static route file. Warnings and
// the CART and monitor outputs are those of the static render. For llm and
// video routes, with failureMode unset, FailOpen and FailClose.
func TestDynamicRouteFileIgnoresEndpoints(t *testing.T) {
	snaps := dynamicSnapshots()
	for _, base := range dynamicRoutes() {
		for _, mode := range []string{"", routespec.FailOpen, routespec.FailClose} {
			r := clone(base)
			r.Spec.FailureMode = mode
			label := mode
			if label == "" {
				label = "unset"
			}
			t.Run(base.Name+"/"+label, func(t *testing.T) {
				var files [][]byte
				tables := map[string]string{} // table -> static route file
				statics := map[string]string{}
				for _, s := range snaps {
					static, serr := Compile(r, s.snap, Options{})
					dyn, derr := Compile(r, s.snap, Options{DynamicPeers: true})
					if serr != nil || derr != nil {
						// Nothing renderable (FailClose without a cart
						// VIP): the same error both ways.
						if serr == nil || derr == nil || serr.Error() != derr.Error() || !errors.Is(derr, ErrNoPeers) {
							t.Fatalf("%s: static error %v, dynamic error %v", s.name, serr, derr)
						}
						continue
					}
					if !slices.Equal(static.Warnings, dyn.Warnings) || !reflect.DeepEqual(static.Skipped, dyn.Skipped) {
						t.Errorf("%s: warnings differ:\nstatic  %q\ndynamic %q", s.name, static.Warnings, dyn.Warnings)
					}
					var keys []OwnedKey
					for _, o := range dyn.Outputs {
						keys = append(keys, OwnedKey{ConfigMap: o.ConfigMap, Key: o.Key})
					}
					var want []OwnedKey
					for _, k := range OutputKeysFor(r, true) {
						want = append(want, OwnedKey{ConfigMap: k.ConfigMap, Key: k.Key})
					}
					if !slices.Equal(keys, want) || len(dyn.Outputs) != len(static.Outputs)+1 {
						t.Fatalf("%s: outputs %v, want %v (OutputKeysFor)", s.name, keys, want)
					}
					file := render(t, dyn.Outputs[0])
					table := render(t, dyn.Outputs[1])
					staticFile := render(t, static.Outputs[0])
					files = append(files, file)
					if prev, ok := tables[string(table)]; ok && prev != string(staticFile) {
						t.Errorf("%s: one peers table for two static route files", s.name)
					}
					if prev, ok := statics[string(staticFile)]; ok && prev != string(table) {
						t.Errorf("%s: two peers tables for one static route file", s.name)
					}
					tables[string(table)], statics[string(staticFile)] = string(staticFile), string(table)
					if got := fromTable(t, r, table); !bytes.Equal(got, staticFile) {
						t.Errorf("%s: the static route file rendered from the peers table differs from the static route file:\n%s\nwant\n%s", s.name, got, staticFile)
					}
					// CART and monitor: the static bytes.
					for i, o := range static.Outputs[1:] {
						if a, b := renderWith(t, o, []byte(cartBase)), renderWith(t, dyn.Outputs[i+2], []byte(cartBase)); !bytes.Equal(a, b) {
							t.Errorf("%s: %s differs from the static render", s.name, o.Key)
						}
					}
				}
				if len(files) < 2 || len(tables) < 2 {
					t.Fatalf("only %d renders and %d distinct tables: the snapshots do not exercise the route", len(files), len(tables))
				}
				for i, f := range files[1:] {
					if !bytes.Equal(f, files[0]) {
						t.Fatalf("route file of render %d differs from the first:\n%s\nfirst:\n%s", i+1, f, files[0])
					}
				}
				if bytes.Contains(files[0], []byte("10.0.")) || bytes.Contains(files[0], []byte("fd00")) || bytes.Contains(files[0], []byte("register_route(")) {
					t.Errorf("dynamic route file holds peers:\n%s", files[0])
				}
			})
		}
	}
}

func render(t *testing.T, o Output) []byte { return renderWith(t, o, nil) }

func renderWith(t *testing.T, o Output, current []byte) []byte {
	t.Helper()
	b, err := o.Render(current)
	if err != nil {
		t.Fatalf("%s: %v", o.Key, err)
	}
	return b
}

// fromTable renders r's static route file from the tiers of a peers
// table (what the static render would write with exactly these tiers).
func fromTable(t *testing.T, r *Route, table []byte) []byte {
	t.Helper()
	tb, err := peers.Parse(table)
	if err != nil {
		t.Fatalf("peers table does not parse: %v\n%s", err, table)
	}
	if tb.Route != RouteName(r) {
		t.Fatalf("peers table route %q, want %q", tb.Route, RouteName(r))
	}
	var tiers []tier
	for _, tr := range tb.Tiers {
		x := tier{use: tr.Use, priority: tr.Priority, maxConc: tr.MaxConcurrency, probe: tr.ProbePath}
		for _, p := range tr.Peers {
			x.peers = append(x.peers, endpoint{ip: p.Host, port: p.Port, v6: strings.Contains(p.Host, ":")})
		}
		tiers = append(tiers, x)
	}
	opts, _ := Options{}.withDefaults()
	c := compilation{route: r, name: RouteName(r), opts: opts, res: &Result{}}
	var b []byte
	if r.Spec.ModelType == routespec.ModelTypeVideo {
		b, err = c.renderVideo(tiers)
	} else {
		b, err = c.renderLLM(tiers)
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDynamicPeersTable pins the table of a known route and snapshot: the
// cart tier's limit from the backend count, default_max and the probe
// path filled in, the FailOpen tiers added below, IPv6 without brackets.
func TestDynamicPeersTable(t *testing.T) {
	r := dynamicRoutes()[0]
	r.Spec.FailureMode = routespec.FailOpen
	r.Spec.Nginx.Peers = r.Spec.Nginx.Peers[:2] // cart and backend: FailOpen adds backend-svc
	snap := normalized(Snapshot{
		Backends:       []Endpoint{{IP: "fd00::1", Port: 8000}, {IP: "10.0.0.1", Port: 8000}, {IP: "10.0.0.2", Port: 8001}},
		BackendService: &ServiceVIP{IP: "10.96.0.10", Port: 8000},
		CartService:    &ServiceVIP{IP: "10.96.0.20", Port: 9000},
	})
	res, err := Compile(r, snap, Options{DynamicPeers: true})
	if err != nil {
		t.Fatal(err)
	}
	o := res.Outputs[1]
	if o.ConfigMap != "llm-route/openresty-conf" || o.Key != "peers_dyn.json" || o.Key != PeersKey(r) {
		t.Fatalf("second output %s/%s", o.ConfigMap, o.Key)
	}
	tb, err := peers.Parse(render(t, o))
	if err != nil {
		t.Fatal(err)
	}
	want := []peers.Tier{
		{Use: "cart", Priority: 3, MaxConcurrency: 12, ProbePath: "/health", Peers: []peers.Peer{{Host: "10.96.0.20", Port: 9000}}},
		{Use: "backend", Priority: 2, MaxConcurrency: 4, ProbePath: "/v1/models", Peers: []peers.Peer{{Host: "10.0.0.1", Port: 8000}, {Host: "10.0.0.2", Port: 8001}, {Host: "fd00::1", Port: 8000}}},
		{Use: "backend-svc", Priority: 1, MaxConcurrency: 16, ProbePath: "/v1/models", Peers: []peers.Peer{{Host: "10.96.0.10", Port: 8000}}},
	}
	if tb.Format != peers.Format || tb.Route != "dyn" || !reflect.DeepEqual(tb.Tiers, want) {
		t.Errorf("table %+v\nwant tiers %+v", tb, want)
	}
}

// TestOutputKeysFor: the spec-only key lists know the peers key exactly
// when rendering is dynamic, in Compile's order; the functions without
// the flag are the static lists.
func TestOutputKeysFor(t *testing.T) {
	r := dynamicRoutes()[0]
	keys := func(ks []OwnedKey) []string {
		var out []string
		for _, k := range ks {
			out = append(out, k.ConfigMap+"|"+k.Key+"|"+k.Field)
		}
		return out
	}
	static := []string{
		"llm-route/openresty-conf|session_route_dyn.conf|spec.nginx.route",
		"llm-route/cart-conf|config.yaml|spec.cart.outputConfigMap",
		"monitoring/mon|dyn.monitor.conf|spec.monitor.model",
	}
	dynamic := slices.Insert(slices.Clone(static), 1, "llm-route/openresty-conf|peers_dyn.json|spec.nginx.route")
	for _, c := range []struct {
		name      string
		got, want []string
	}{
		{"OutputKeys", keys(OutputKeys(r)), static},
		{"OutputKeysFor false", keys(OutputKeysFor(r, false)), static},
		{"OutputKeysFor true", keys(OutputKeysFor(r, true)), dynamic},
		{"OwnedKeys", keys(OwnedKeys(r)), slices.Delete(slices.Clone(static), 1, 2)},
		{"OwnedKeysFor false", keys(OwnedKeysFor(r, false)), slices.Delete(slices.Clone(static), 1, 2)},
		{"OwnedKeysFor true", keys(OwnedKeysFor(r, true)), slices.Delete(slices.Clone(dynamic), 2, 3)},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s:\n got %q\nwant %q", c.name, c.got, c.want)
		}
	}
	// A route without an nginx output ConfigMap (not validated) has no
	// peers key either.
	r.Spec.Nginx.OutputConfigMap = ""
	if ks := keys(OutputKeysFor(r, true)); slices.ContainsFunc(ks, func(k string) bool { return strings.Contains(k, "peers_") }) {
		t.Errorf("peers key without an nginx ConfigMap: %q", ks)
	}
}

// dynamicGoldens are the routes pinned in testdata/golden/dynamic/: an llm
// route with CART and monitor, two video routes with api_keys and
// rate_limit, and FailOpen llm routes (selector mode; three tiers with the
// cart limit from the backends). Each golden holds every output, the
// peers key second.
var dynamicGoldens = []struct{ rel, mode string }{
	{"deploy/samples/modelroute-llm.yaml", ""},
	{"deploy/samples/modelroute-video.yaml", ""},
	{"testdata/routes/valid/video-all-values.yaml", ""},
	{"testdata/routes/valid/failopen-selector.yaml", ""},
	{"testdata/routes/valid/llm-full.yaml", routespec.FailOpen},
}

// TestGoldenDynamic compiles dynamicGoldens with Options.DynamicPeers
// against testdata/snapshots/default.yaml into
// testdata/golden/dynamic/<route>[.<mode>].txt. Update with
//
//	AUTOCONFIG_UPDATE=1 go test -run TestGoldenDynamic ./compiler
func TestGoldenDynamic(t *testing.T) {
	root, routes, _, snap, base := goldenInputs(t)
	for _, g := range dynamicGoldens {
		name := strings.TrimSuffix(filepath.Base(g.rel), ".yaml")
		if g.mode != "" {
			name += "." + g.mode
		}
		t.Run(name, func(t *testing.T) {
			r, ok := routes[g.rel]
			if !ok {
				t.Fatalf("%s is not a valid corpus route", g.rel)
			}
			r = clone(r)
			if g.mode != "" {
				r.Spec.FailureMode = g.mode
			}
			if g.mode == routespec.FailOpen && r.Spec.FailureMode != routespec.FailOpen {
				t.Fatal("mode not applied")
			}
			res, err := Compile(r, snap, Options{DynamicPeers: true})
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			got.WriteString("# " + g.rel)
			if g.mode != "" {
				got.WriteString(" (" + g.mode + ")")
			}
			got.WriteString(" compiled with dynamic peers and testdata/snapshots/default.yaml\n")
			for _, w := range res.Warnings {
				got.WriteString("# warning: " + w + "\n")
			}
			for _, o := range res.Outputs {
				got.WriteString("\n==> " + o.ConfigMap + "/" + o.Key + " <==\n")
				got.Write(renderWith(t, o, base))
			}
			if res.Outputs[1].Key != PeersKey(r) {
				t.Errorf("second output is %s, want the peers key", res.Outputs[1].Key)
			}
			checkGolden(t, filepath.Join(root, "testdata", "golden", "dynamic", name+".txt"), got.Bytes(), "TestGoldenDynamic")
		})
	}
}

// TestDynamicFalseIsStatic: Options.DynamicPeers false is the zero value,
// so every existing golden (TestGolden, TestGoldenFailureModes) proves the
// static bytes unchanged; here the explicit false renders what the zero
// Options render, and a dynamic render differs only in the route file and
// the added peers key.
func TestDynamicFalseIsStatic(t *testing.T) {
	_, routes, rels, snap, base := goldenInputs(t)
	for _, rel := range rels {
		r := routes[rel]
		zero, err := Compile(r, snap, Options{})
		if err != nil {
			t.Fatal(err)
		}
		explicit, err := Compile(r, snap, Options{DynamicPeers: false, SockDir: DefaultSockDir})
		if err != nil {
			t.Fatal(err)
		}
		if a, b := renderAll(t, zero, base), renderAll(t, explicit, base); a != b {
			t.Errorf("%s: DynamicPeers false renders differently from the zero Options", rel)
		}
		dyn, err := Compile(r, snap, Options{DynamicPeers: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(dyn.Outputs) != len(zero.Outputs)+1 {
			t.Fatalf("%s: %d dynamic outputs, %d static", rel, len(dyn.Outputs), len(zero.Outputs))
		}
		rest := Result{Outputs: slices.Delete(slices.Clone(dyn.Outputs), 0, 2)}
		if a, b := renderAll(t, Result{Outputs: zero.Outputs[1:]}, base), renderAll(t, rest, base); a != b {
			t.Errorf("%s: CART or monitor output differs in dynamic mode", rel)
		}
	}
}
