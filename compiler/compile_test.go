package compiler

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/modelsphere/autoconfig/schema/routespec"
)

func renderAll(t testing.TB, res Result, base []byte) string {
	t.Helper()
	var b bytes.Buffer
	for _, o := range res.Outputs {
		data, err := o.Render(base)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("==> " + o.ConfigMap + "/" + o.Key + " <==\n")
		b.Write(data)
	}
	return b.String()
}

const cartBase = "# chart\nserver:\n  port: 9000 # port\nworkers: [] # filled by autoconfig\npolicy: cache_aware\n"

// TestDeterministic: shuffled and duplicated endpoints render the same bytes
// once normalised (endpoints.Normalize, as discovery does).
func TestDeterministic(t *testing.T) {
	r := llmRoute("m", map[string]string{"default_max": "8", "b": "2", "a": "1"},
		routespec.Peer{Use: "backend", Priority: 2, MaxConcurrency: 4},
		routespec.Peer{Use: "cart", Priority: 3, MaxConcurrencyFromBackend: true})
	r.Spec.Cart = &routespec.Cart{OutputConfigMap: "ns2/cart", MaxLoad: 7}
	r.Spec.Monitor = &routespec.Monitor{OutputConfigMap: "mon", Model: "org/m"}
	snap := benchSnapshot(50)
	want := renderAll(t, mustCompile(t, r, snap), []byte(cartBase))
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20; i++ {
		s := snap
		s.Backends = append([]Endpoint(nil), snap.Backends...)
		s.Backends = append(s.Backends, s.Backends[rng.IntN(len(s.Backends))])
		rng.Shuffle(len(s.Backends), func(i, j int) { s.Backends[i], s.Backends[j] = s.Backends[j], s.Backends[i] })
		if got := renderAll(t, mustCompile(t, r, normalized(s)), []byte(cartBase)); got != want {
			t.Fatalf("shuffle %d rendered different bytes", i)
		}
	}
	if !strings.Contains(want, "==> llm-route/openresty-conf/session_route_m.conf <==") ||
		!strings.Contains(want, "==> ns2/cart/config.yaml <==") ||
		!strings.Contains(want, "==> llm-route/mon/org_m.monitor.conf <==") ||
		!strings.Contains(want, `[ "max_concurrency" ] = 200,`) {
		t.Fatalf("unexpected outputs:\n%s", want)
	}
}

func mustCompile(t testing.TB, r *Route, s Snapshot) Result {
	t.Helper()
	res, err := Compile(r, s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestCompileErrorsAndWarnings(t *testing.T) {
	r := llmRoute("m", nil, routespec.Peer{Use: "backend", Priority: 2}, routespec.Peer{Use: "backend-svc", Priority: 1})
	if _, err := Compile(r, Snapshot{}, Options{}); !errors.Is(err, ErrNoBackends) {
		t.Errorf("empty backends: %v, want ErrNoBackends", err)
	}
	for _, bad := range []Endpoint{{IP: "10.0.0.x", Port: 80}, {IP: "10.0.0.1", Port: 0}, {IP: "fe80::1%eth0", Port: 80}} {
		if _, err := Compile(r, Snapshot{Backends: []Endpoint{bad}}, Options{}); err == nil {
			t.Errorf("endpoint %+v accepted", bad)
		}
	}
	// Lists not in normal form (discovery normalises) are refused, naming
	// the violation; a bad endpoint is reported first.
	for want, list := range map[string][]Endpoint{
		"is out of order after": {{IP: "10.0.0.2", Port: 80}, {IP: "10.0.0.1", Port: 80}},
		"duplicates":            {{IP: "10.0.0.1", Port: 80}, {IP: "::ffff:10.0.0.1", Port: 80}},
		"bad IP":                {{IP: "10.0.0.2", Port: 80}, {IP: "10.0.0.1", Port: 80}, {IP: "x", Port: 80}},
	} {
		if _, err := Compile(r, Snapshot{Backends: list}, Options{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want an error with %q", list, err, want)
		}
	}
	if _, err := Compile(r, Snapshot{Backends: []Endpoint{{IP: "10.0.0.1", Port: 80}}}, Options{SockDir: "/x; y"}); err == nil {
		t.Error("sock dir with ';' accepted")
	}
	bad := llmRoute("Bad;", nil, routespec.Peer{Use: "backend", Priority: 2})
	if _, err := Compile(bad, Snapshot{Backends: []Endpoint{{IP: "10.0.0.1", Port: 80}}}, Options{}); err == nil {
		t.Error("route name with ';' accepted")
	}
	// No VIP: the backend-svc tier is skipped with a warning.
	res := mustCompile(t, r, Snapshot{Backends: []Endpoint{{IP: "10.0.0.1", Port: 80}}})
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "backend-svc") {
		t.Errorf("warnings %q", res.Warnings)
	}
	// Selector mode: skipped even if a VIP is given.
	r.Spec.Discovery = routespec.Discovery{Selector: "app=m"}
	res = mustCompile(t, r, Snapshot{Backends: []Endpoint{{IP: "10.0.0.1", Port: 80}}, BackendService: &ServiceVIP{IP: "10.96.0.1", Port: 80}})
	conf, _ := res.Outputs[0].Render(nil)
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "selector") || bytes.Contains(conf, []byte("10.96.0.1")) {
		t.Errorf("selector mode: warnings %q", res.Warnings)
	}
	// Only a tier that cannot render: ErrNoPeers.
	only := llmRoute("m", nil, routespec.Peer{Use: "backend-svc", Priority: 1})
	if _, err := Compile(only, Snapshot{Backends: []Endpoint{{IP: "10.0.0.1", Port: 80}}}, Options{}); !errors.Is(err, ErrNoPeers) {
		t.Errorf("no renderable tier: %v", err)
	}
}

func TestRenderCartConfig(t *testing.T) {
	w := []CartWorker{{URL: "http://10.0.0.1:8000", MaxLoad: 20}, {URL: "http://[fd00::1]:8000", MaxLoad: 20}}
	got, err := RenderCartConfig([]byte(cartBase), w, "ns/cart", "")
	if err != nil {
		t.Fatal(err)
	}
	want := "# chart\nserver:\n  port: 9000 # port\nworkers: # filled by autoconfig\n  - url: http://10.0.0.1:8000\n    max_load: 20\n  - url: http://[fd00::1]:8000\n    max_load: 20\npolicy: cache_aware\n"
	if string(got) != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	// Rendering its own output again changes nothing (no-op reconcile).
	again, err := RenderCartConfig(got, w, "ns/cart", "")
	if err != nil || !bytes.Equal(again, got) {
		t.Errorf("second render differs: %v\n%s", err, again)
	}
	// No workers key: appended at the end.
	got, _ = RenderCartConfig([]byte("server:\n  port: 1\n"), w[:1], "ns/cart", "")
	if string(got) != "server:\n  port: 1\nworkers:\n  - url: http://10.0.0.1:8000\n    max_load: 20\n" {
		t.Errorf("append: %s", got)
	}
	for name, base := range map[string][]byte{"missing": nil, "empty": {}, "unparsable": []byte("a: [\n"), "list": []byte("- a\n")} {
		if _, err := RenderCartConfig(base, w, "ns/cart", ""); !errors.Is(err, ErrCartBase) {
			t.Errorf("%s base: %v, want ErrCartBase", name, err)
		}
	}
}

// TestShortGPU reads nvidia.com/gpu.product labels in the form GPU feature
// discovery writes them (product name, spaces as '-').
func TestShortGPU(t *testing.T) {
	for in, want := range map[string]string{
		"NVIDIA-H100-80GB-HBM3":            "H100",
		"NVIDIA-H100-PCIe":                 "H100",
		"NVIDIA-H100-NVL":                  "H100",
		"NVIDIA-H200":                      "H200",
		"NVIDIA-H20":                       "H20",
		"NVIDIA-H20-3e":                    "H20",
		"NVIDIA-H800":                      "H800",
		"NVIDIA-GH200-480GB":               "GH200",
		"NVIDIA-B200":                      "B200",
		"NVIDIA-A100-SXM4-80GB":            "A100",
		"NVIDIA-A100-PCIE-40GB":            "A100",
		"NVIDIA-A800-SXM4-80GB":            "A800",
		"NVIDIA-A100-SXM4-40GB-MIG-1g.5gb": "A100",
		"NVIDIA-A10G":                      "A10G",
		"NVIDIA-L40S":                      "L40S",
		"NVIDIA-L4":                        "L4",
		"Tesla-T4":                         "T4",
		"Tesla-V100-SXM2-16GB":             "V100",
		"NVIDIA-GeForce-RTX-4090":          "RTX4090",
		"NVIDIA-GeForce-RTX-3090-Ti":       "RTX3090",
		"NVIDIA-RTX-A6000":                 "RTXA6000",
		"NVIDIA-RTX-6000-Ada-Generation":   "RTX6000",
		"NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition":            "RTXPRO6000",
		"NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition": "RTXPRO6000",
		"Quadro-RTX-8000":  "RTX8000",
		"NVIDIA-TITAN-RTX": "TITANRTX",
		"NVIDIA-RTX":       "RTX",
		"":                 "",
		"NVIDIA":           "",
		"weird value":      "",
	} {
		if got := ShortGPU(in); got != want {
			t.Errorf("ShortGPU(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMonitor(t *testing.T) {
	r := llmRoute("m", nil, routespec.Peer{Use: "backend", Priority: 2})
	r.Spec.Monitor = &routespec.Monitor{OutputConfigMap: "mon/conf", Model: "org/model"}
	snap := normalized(Snapshot{
		Backends: []Endpoint{
			{IP: "10.0.0.2", Port: 80, GPUProduct: "NVIDIA-A100-SXM4-80GB"},
			{IP: "10.0.0.1", Port: 80, GPUProduct: "NVIDIA-H100-80GB-HBM3"},
			{IP: "10.0.0.3", Port: 80},
		},
		NginxPods: []Endpoint{{IP: "10.1.0.1", Port: 8080}},
		CartPods:  []Endpoint{{IP: "10.2.0.1", Port: 9000}},
	})
	res := mustCompile(t, r, snap)
	got, _ := res.Outputs[1].Render(nil)
	want := "# org_model.monitor.conf: written by autoconfig from ModelRoute llm-route/m; do not edit.\n" +
		"service: model=org/model gpu_type= endpoint=10.0.0.1:80\n" +
		"service: model=org/model gpu_type= endpoint=10.0.0.2:80\n" +
		"service: model=org/model gpu_type= endpoint=10.0.0.3:80\n" +
		"nginx: endpoint=10.1.0.1:8080\n"
	if res.Outputs[1].Key != "org_model.monitor.conf" || res.Outputs[1].ConfigMap != "mon/conf" || string(got) != want {
		t.Errorf("got %s %s:\n%s", res.Outputs[1].ConfigMap, res.Outputs[1].Key, got)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "A100, H100") {
		t.Errorf("warnings %q", res.Warnings)
	}
	// Explicit switches and gpuType win; router lines with spec.cart.
	f, tr := false, true
	r.Spec.Monitor = &routespec.Monitor{OutputConfigMap: "conf", GPUType: "H20", Nginx: &f, Router: &tr}
	got, _ = mustCompile(t, r, snap).Outputs[1].Render(nil)
	if !strings.Contains(string(got), "gpu_type=H20 endpoint=10.0.0.1:80\n") || strings.Contains(string(got), "nginx:") ||
		!strings.Contains(string(got), "router: url=http://10.2.0.1:9000/workers\n") {
		t.Errorf("switches: %s", got)
	}
}

func TestRateLimitBytes(t *testing.T) {
	for in, want := range map[string]string{
		"200Mbps": "25000000", "1.5Gbps": "187500000", "8Mbps": "1000000", "100Kbps": "12500",
		"12bps": "1", "7bps": "1", "1bps": "1", "0.001Kbps": "1", "25m": "25m", "512k": "512k", "1000": "1000", "2g": "2147483648", "0.5Mbps": "62500",
	} {
		got, err := RateLimitBytes(in)
		if err != nil || got != want {
			t.Errorf("RateLimitBytes(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0bps", "0.0Kbps", "fast", "1.5m", "25 m", "0"} {
		if got, err := RateLimitBytes(bad); err == nil {
			t.Errorf("RateLimitBytes(%q) = %q, want an error", bad, got)
		}
	}
}

func TestIdentUnique(t *testing.T) {
	seen := map[string]string{}
	for _, r := range []string{"a.b", "a-b", "a_b", "a_db", "a__b", "a_hb", "a_d", "ab"} {
		id := ident(r)
		if o, dup := seen[id]; dup {
			t.Errorf("routes %q and %q share identifier %q", o, r, id)
		}
		seen[id] = r
	}
}

// TestResultKeys: Result.Keys names exactly the keys Compile renders, in
// its order, with and without dynamic peers, and the route's mark, route
// file ConfigMap and monitor key.
func TestResultKeys(t *testing.T) {
	r := llmRoute("m", nil, routespec.Peer{Use: "backend", Priority: 2})
	r.Spec.Cart = &routespec.Cart{OutputConfigMap: "ns2/cart", MaxLoad: 7}
	r.Spec.Monitor = &routespec.Monitor{OutputConfigMap: "mon", Model: "org/m"}
	for _, dynamic := range []bool{false, true} {
		res, err := Compile(r, benchSnapshot(3), Options{DynamicPeers: dynamic})
		if err != nil {
			t.Fatal(err)
		}
		k := res.Keys
		if len(k.Outputs) != len(res.Outputs) {
			t.Fatalf("dynamic %v: %d keys for %d outputs", dynamic, len(k.Outputs), len(res.Outputs))
		}
		for i, o := range res.Outputs {
			if k.Outputs[i].ConfigMap != o.ConfigMap || k.Outputs[i].Key != o.Key {
				t.Errorf("dynamic %v: key %d is %s|%s, output %s|%s", dynamic, i, k.Outputs[i].ConfigMap, k.Outputs[i].Key, o.ConfigMap, o.Key)
			}
		}
		if k.Owner != "llm-route/m" || k.NginxConfigMap != "llm-route/openresty-conf" ||
			k.Monitor != (OwnedKey{"llm-route/mon", "org_m.monitor.conf", "spec.monitor.model"}) {
			t.Errorf("dynamic %v: keys %+v", dynamic, k)
		}
	}
}
