package compiler

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/modelsphere/autoconfig/internal/llmsim"
	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// scrapeProbe is test-only nginx configuration inserted into the shipped
// nginx.conf's http{}: a loopback server that fills a route's dict with
// Responses chain keys in the engine's own format (x|<response id> → the
// key its request was placed by, kept 1 h, safe_set: router_affinity's
// remember), and counts every get_keys call on a dict other than the
// metrics dict (every worker wraps the shared dicts' get_keys at start).
func scrapeProbe(port int) string {
	return fmt.Sprintf(`
    lua_shared_dict scrape@probe 1m;
    init_worker_by_lua_block {
        local mt = getmetatable(ngx.shared["scrape@probe"])
        local idx = mt and mt.__index
        if type(idx) == "table" and not idx.autoconfig_wrapped then
            local get_keys = idx.get_keys
            local metrics = ngx.shared["autoconfig@metrics"]
            local probe = ngx.shared["scrape@probe"]
            idx.autoconfig_wrapped = true
            idx.get_keys = function(d, ...)
                if d ~= metrics and d ~= probe then
                    probe:incr("get_keys", 1, 0)
                end
                return get_keys(d, ...)
            end
        end
    }
    server {
        listen 127.0.0.1:%d;
        location = /fill {
            content_by_lua_block {
                local d = ngx.shared[ngx.var.arg_route]
                local from, n = tonumber(ngx.var.arg_from), tonumber(ngx.var.arg_n)
                local stored = 0
                for i = from, from + n - 1 do
                    local id = "resp_" .. string.format("%%024d", i)
                    if d:safe_set("x|" .. id, "chat\0You are a helpful assistant.\0conversation " .. i, 3600) then
                        stored = stored + 1
                    end
                end
                ngx.say(stored)
            }
        }
        location = /get_keys {
            content_by_lua_block {
                ngx.say(ngx.shared["scrape@probe"]:get("get_keys") or 0)
            }
        }
    }
`, port)
}

// scrapeRig: nginx (shipped nginx.conf, 2 workers) with the probe server,
// an llm route over pods with an SLO (so every per-peer gauge has a value)
// and a dict large enough for 100,000 chain keys.
type scrapeRig struct {
	*engineRig
	probe string
}

func newScrapeRig(tb testing.TB, pods int) *scrapeRig {
	tb.Helper()
	port, err := nginxtest.FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	ps, err := llmsim.StartPods(pods, quickPods)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ps.Close() })
	r := llmRoute("scr", map[string]string{SharedDictSizeKey: "64m", "default_max": "8"}, backendTier)
	r.Spec.SLO = &routespec.SLO{TTFTMs: 1} // missed: every limit moves (l|)
	rig := &engineRig{
		n:     nginxtest.Start(tb, nginxtest.Options{Reference: true, Workers: 2, HTTPConfig: scrapeProbe(port)}),
		route: r, pods: ps,
		client: &http.Client{Timeout: 60 * time.Second},
	}
	tb.Cleanup(rig.client.CloseIdleConnections)
	var eps []Endpoint
	for _, p := range ps {
		eps = append(eps, Endpoint{IP: "127.0.0.1", Port: int32(p.Port()), Ready: true})
	}
	install2(tb, rig.n, r, Snapshot{Backends: eps})
	return &scrapeRig{engineRig: rig, probe: "http://127.0.0.1:" + strconv.Itoa(port)}
}

// install2 is install for a testing.TB (benchmarks too).
func install2(tb testing.TB, n *nginxtest.Nginx, route *Route, snap Snapshot) {
	tb.Helper()
	res, err := Compile(route, normalized(snap), Options{SockDir: n.SockDir()})
	if err != nil {
		tb.Fatal(err)
	}
	conf, err := res.Outputs[0].Render(nil)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.RoutesDir(), res.Outputs[0].Key), conf, 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := n.Test(); err != nil {
		tb.Fatal(err)
	}
	if err := n.Reload(); err != nil {
		tb.Fatal(err)
	}
}

func (s *scrapeRig) get(tb testing.TB, path string) string {
	tb.Helper()
	resp, err := http.Get(s.probe + path)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		tb.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return strings.TrimSpace(string(b))
}

// fill stores n chain keys in the route's dict (ids from..from+n-1).
func (s *scrapeRig) fill(tb testing.TB, from, n int) {
	tb.Helper()
	for done := 0; done < n; done += 10000 {
		k := min(10000, n-done)
		got := s.get(tb, fmt.Sprintf("/fill?route=scr&from=%d&n=%d", from+done, k))
		if got != strconv.Itoa(k) {
			tb.Fatalf("fill: %s of %d chain keys stored", got, k)
		}
	}
}

// traffic sends streamed chat requests, so each peer has all four gauges.
func (s *scrapeRig) traffic(tb testing.TB, n int) {
	tb.Helper()
	for i := 0; i < n; i++ {
		conv := &llmsim.Conversation{System: "You are a helpful assistant.", FirstUser: fmt.Sprintf("question %d", i), MaxTokens: 8}
		res := llmsim.Chat(tb.Context(), s.client, s.url(), conv.Next("hi"), nil)
		if res.Err != nil || res.Status != 200 {
			tb.Fatalf("request %d: %d %v", i, res.Status, res.Err)
		}
	}
}

// peerGauges: the per-peer gauge series of a scrape, "name{labels} value".
func peerGauges(fams map[string]*dto.MetricFamily) []string {
	var out []string
	for name, f := range fams {
		if !strings.HasPrefix(name, "autoconfig_engine_peer_") {
			continue
		}
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			out = append(out, fmt.Sprintf("%s{%s} %v", name, strings.Join(ls, ","), m.GetGauge().GetValue()))
		}
	}
	sort.Strings(out)
	return out
}

// TestNginxScrapeReadsSeries: a scrape of :9145 reads the keys of its
// series, never every key of the route dicts (docs/metrics.md, engine):
// with 100,000 Responses chain keys in the route's dict, scrapes through
// both workers call get_keys on no route dict (before: one walk of every
// key per dict and scrape), and export exactly the per-peer gauges they
// exported without the chain keys: in flight, limit, decode and TTFT
// EWMAs of each of the 4 pods.
func TestNginxScrapeReadsSeries(t *testing.T) {
	s := newScrapeRig(t, 4)
	s.traffic(t, 40)
	before := peerGauges(scrapeCounted(t, s.n, "scr", 40))
	if len(before) != 16 {
		t.Fatalf("%d per-peer gauge series, want 16 (4 kinds x 4 pods):\n%s", len(before), strings.Join(before, "\n"))
	}
	s.fill(t, 0, 100000)
	calls0 := s.get(t, "/get_keys")
	for i := 0; i < 10; i++ {
		// New connections: the scrapes land on both workers.
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get(s.n.MetricsURL())
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	after := peerGauges(scrape(t, s.n))
	if calls := s.get(t, "/get_keys"); calls != calls0 {
		t.Errorf("11 scrapes called get_keys on a route dict %s times (before them: %s), want none", calls, calls0)
	}
	if strings.Join(before, "\n") != strings.Join(after, "\n") {
		t.Errorf("per-peer gauges changed with 100,000 chain keys:\nbefore:\n%s\nafter:\n%s", strings.Join(before, "\n"), strings.Join(after, "\n"))
	}
}

// BenchmarkScrape: one GET /metrics of the shipped engine (2 workers, one
// route of 8 pods, 32 per-peer gauge series) with 0 and with 100,000
// Responses chain keys in the route's dict; reports both times and their
// ratio (the goal: about 1, the scrape's cost set by its series only).
//
//	go test -run '^$' -bench BenchmarkScrape -benchtime 200x -count 3 ./compiler
func BenchmarkScrape(b *testing.B) {
	s := newScrapeRig(b, 8)
	s.traffic(b, 80)
	c := &http.Client{Timeout: 30 * time.Second}
	b.Cleanup(c.CloseIdleConnections)
	one := func() {
		resp, err := c.Get(s.n.MetricsURL())
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("GET /metrics: %d", resp.StatusCode)
		}
	}
	measure := func() time.Duration {
		for i := 0; i < 20; i++ {
			one()
		}
		start := time.Now()
		for i := 0; i < b.N; i++ {
			one()
		}
		return time.Since(start) / time.Duration(b.N)
	}
	empty := measure()
	s.fill(b, 0, 100000)
	full := measure()
	b.ReportMetric(float64(empty.Microseconds()), "us/scrape@0")
	b.ReportMetric(float64(full.Microseconds()), "us/scrape@100k")
	b.ReportMetric(float64(full)/float64(empty), "ratio")
}
