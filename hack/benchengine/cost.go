package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/llmsim"
)

// The cost scenario: what the engine adds to a request, against a plain
// proxy_pass on the same nginx, with 10 and with 10,000 peers (-cost-peers), all of
// them the same tiny backend (a listener on 0.0.0.0 takes connections to
// every 127.0.0.0/8 address).

// costAnswer is the backend's answer: a small non-streamed chat
// completion with usage (the engine's body filter reads it).
const costAnswer = `{"id":"chatcmpl-bench","object":"chat.completion","created":1,"model":"bench",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}`

// costVariant is one route's cost for one kind of request.
type costVariant struct {
	Route string `json:"route"`
	Kind  string `json:"kind"`
	// P50 is the median of every measured request's own time, µs: the
	// number the goals are held against (other work on the machine moves
	// it less than a mean).
	P50 float64 `json:"request_p50_us"`
	// Rounds are the mean µs per request of each round; MeanMedian their
	// median.
	Rounds     []float64 `json:"round_means_us"`
	MeanMedian float64   `json:"round_means_median_us"`
	// CPU is the nginx workers' CPU time per measured request, µs
	// (/proc/<pid>/schedstat): what the request cost nginx, client and
	// backend left out.
	CPU    float64 `json:"nginx_cpu_us"`
	Failed int     `json:"failed"`
	times  []time.Duration
	cpuNS  int64
}

// costRatios are, per request kind, the engine's smallest tier / plain
// proxy_pass and its largest tier / its smallest.
type costRatios struct {
	EngineOverPlain map[string]float64 `json:"engine_over_plain"`
	BigOverSmall    map[string]float64 `json:"largest_over_smallest"`
}

func newRatios() costRatios {
	return costRatios{EngineOverPlain: map[string]float64{}, BigOverSmall: map[string]float64{}}
}

func (c costRatios) set(kind string, plain, small, big float64) {
	if plain > 0 && small > 0 {
		c.EngineOverPlain[kind] = small / plain
		c.BigOverSmall[kind] = big / small
	}
}

type costResult struct {
	Requests int           `json:"requests_per_round"`
	Rounds   int           `json:"rounds"`
	Warmup   int           `json:"warmup_requests"`
	Block    int           `json:"block"`
	Variants []costVariant `json:"variants"`
	// Routes are the variants: plain, then engine-<peers> for each
	// -cost-peers entry, smallest first.
	Routes []string `json:"routes"`
	// The ratios of the per-request medians (the goals'), of the rounds'
	// means, and of the nginx CPU per request.
	P50        costRatios `json:"request_p50"`
	RoundMeans costRatios `json:"round_means"`
	CPU        costRatios `json:"nginx_cpu"`
}

// costKinds are the requests: an x-session-id each (the header key), no
// header and a distinct chat body each (the body key, parsed from the
// JSON), and a distinct body with no user message (no key: least load).
var costKinds = []string{"header", "body", "none"}

func runCost(g *rig, o *options) (*costResult, error) {
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		return nil, fmt.Errorf("cost backend: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	answer := []byte(costAnswer)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		w.Write(answer)
	})}
	go srv.Serve(ln)
	defer srv.Close()

	plain := fmt.Sprintf("server {\n    listen unix:%s;\n    location / {\n        proxy_pass http://127.0.0.1:%d;\n"+
		"        proxy_http_version 1.1;\n        proxy_set_header Connection \"\";\n    }\n}\n", g.n.SockPath("plain"), port)
	if err := g.writeRoute("plain.conf", []byte(plain)); err != nil {
		return nil, err
	}
	defer os.Remove(filepath.Join(g.n.RoutesDir(), "plain.conf"))
	urls := map[string]string{"plain": g.n.URL("plain") + "v1/chat/completions"}
	costRoutes := []string{"plain"}
	for _, peers := range o.CostPeers {
		name := "engine-" + strconv.Itoa(peers)
		route := llmRoute(name, nil, nil)
		eps := make([]compiler.Endpoint, peers)
		// 127.0.0.1 … 127.0.0.250, 127.0.1.1 …: 250 addresses a /24.
		for i := range eps {
			eps[i] = compiler.Endpoint{IP: fmt.Sprintf("127.0.%d.%d", i/250, i%250+1), Port: int32(port), Ready: true}
		}
		logf("cost: installing %s", name)
		if err := g.install(route, eps); err != nil {
			return nil, err
		}
		defer g.removeRoute(route)
		urls[name] = g.chatURL(route)
		costRoutes = append(costRoutes, name)
	}

	res := &costResult{Requests: o.CostRequests, Rounds: o.CostRounds, Warmup: o.CostWarmup, Block: o.CostBlock, Routes: costRoutes,
		P50: newRatios(), RoundMeans: newRatios(), CPU: newRatios()}
	workers := g.n.WorkerPIDs()
	client := newClient(2)
	defer client.CloseIdleConnections()
	seq := 0
	// one sends n requests of kind to url, one after another on one
	// keep-alive connection, and returns the µs per request; with v, it
	// records each request's time and failure in v.
	one := func(url, kind string, n int, v *costVariant) float64 {
		cpu0 := cpuTime(workers)
		start := time.Now()
		last := start
		for range n {
			seq++
			ok := costRequest(client, url, kind, seq)
			now := time.Now()
			if v != nil {
				v.times = append(v.times, now.Sub(last))
				if !ok {
					v.Failed++
				}
			}
			last = now
		}
		if v != nil {
			v.cpuNS += cpuTime(workers) - cpu0
		}
		return float64(last.Sub(start)) / float64(time.Microsecond) / float64(n)
	}
	idx := map[[2]string]int{}
	for _, kind := range costKinds {
		for _, route := range costRoutes {
			idx[[2]string{route, kind}] = len(res.Variants)
			res.Variants = append(res.Variants, costVariant{Route: route, Kind: kind})
		}
	}
	logf("cost: warm-up, %d requests per route and kind", o.CostWarmup)
	for _, kind := range costKinds {
		for _, route := range costRoutes {
			one(urls[route], kind, o.CostWarmup, nil)
		}
	}
	for round := range o.CostRounds {
		logf("cost: round %d of %d, %d requests per route and kind", round+1, o.CostRounds, o.CostRequests)
		// The round's requests go in blocks of o.CostBlock, every route
		// and kind in turn, so other work on the machine falls on all of
		// them alike.
		sum := make([]float64, len(res.Variants))
		for done := 0; done < o.CostRequests; done += o.CostBlock {
			n := min(o.CostBlock, o.CostRequests-done)
			for _, kind := range costKinds {
				for _, route := range costRoutes {
					i := idx[[2]string{route, kind}]
					sum[i] += one(urls[route], kind, n, &res.Variants[i]) * float64(n)
				}
			}
		}
		for i := range res.Variants {
			res.Variants[i].Rounds = append(res.Variants[i].Rounds, sum[i]/float64(o.CostRequests))
		}
	}
	for i := range res.Variants {
		res.Variants[i].MeanMedian = median(res.Variants[i].Rounds)
		res.Variants[i].P50 = float64(llmsim.Percentile(res.Variants[i].times, 0.5)) / float64(time.Microsecond)
		res.Variants[i].CPU = float64(res.Variants[i].cpuNS) / 1000 / float64(o.CostRounds*o.CostRequests)
		if f := res.Variants[i].Failed; f > 0 {
			logf("cost: %s %s: %d requests failed", res.Variants[i].Route, res.Variants[i].Kind, f)
		}
	}
	for _, kind := range costKinds {
		p := res.Variants[idx[[2]string{"plain", kind}]]
		small := res.Variants[idx[[2]string{costRoutes[1], kind}]]
		big := res.Variants[idx[[2]string{costRoutes[len(costRoutes)-1], kind}]]
		res.P50.set(kind, p.P50, small.P50, big.P50)
		res.RoundMeans.set(kind, p.MeanMedian, small.MeanMedian, big.MeanMedian)
		res.CPU.set(kind, p.CPU, small.CPU, big.CPU)
	}
	return res, nil
}

// costRequest sends one small chat request of kind and reads the answer;
// it reports whether it was a 200.
func costRequest(c *http.Client, url, kind string, seq int) bool {
	id := strconv.Itoa(seq)
	var body []byte
	switch kind {
	case "none":
		body = []byte(`{"model":"bench","max_tokens":1,"messages":[{"role":"system","content":"request ` + id + `"}]}`)
	default:
		body = []byte(`{"model":"bench","max_tokens":1,"messages":[{"role":"user","content":"hello, request ` + id + `"}]}`)
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	if kind == "header" {
		req.Header.Set("X-Session-Id", "s-"+id)
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return err == nil && resp.StatusCode == http.StatusOK
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// cpuTime is the time the processes pids have run on a CPU, ns (the
// first field of /proc/<pid>/schedstat); a process that is gone counts 0.
func cpuTime(pids []int) int64 {
	var sum int64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat")
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			n, _ := strconv.ParseInt(f[0], 10, 64)
			sum += n
		}
	}
	return sum
}
