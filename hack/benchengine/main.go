// Command benchengine measures the llm routing engine of the openresty
// image (deploy/openresty/nginx.conf and deploy/openresty/lua/router*.lua)
// on a real nginx with two workers (internal/nginxtest, the shipped
// nginx.conf), in front of vLLM-like simulated pods (internal/llmsim).
// Route files are rendered by the compiler, as the controller renders
// them. Three scenarios, each selectable with -only:
//
//   - sessions: multi-turn conversations over 8 pods with a prefix cache
//     each, with session affinity keyed by the x-session-id header, with
//     affinity off, and keyed by the body; the share of later turns on
//     the previous turn's pod and their time to first token. Then the
//     session keys that move when one pod leaves the route (re-render and
//     reload) and come back when it returns.
//   - overload: 2 pods of 300 tokens/s each, 40 clients streaming (twice
//     what a 30 tokens/s decode SLO allows), with the SLO's adaptive
//     concurrency and with static limits (adaptive_cc "false"): admitted
//     streams' decode rate, delivered tokens, refusals and their latency,
//     the limit the engine holds (GET <route>/_tps_status).
//   - cost: µs per request of the engine's llm route (10 and 10,000
//     peers) against a plain proxy_pass on the same nginx, all reaching
//     one tiny Go backend.
//
// It prints one report (markdown) on stdout, with the goals each number
// is held against, and with -json FILE writes the numbers as JSON.
// Progress goes to stderr. The exit status is 1 when a scenario could not
// run (a missed goal is reported, not an error), 2 on a usage error.
//
//	make bench-engine          # or: go run ./hack/benchengine [flags]
//	go run ./hack/benchengine -only cost -cost-requests 500
//
// It needs Debian's nginx with libnginx-mod-http-lua and lua-cjson
// (internal/nginxtest), or root to install them. The cost scenario's
// backend listens on 0.0.0.0 (an ephemeral port) while it runs.
package main

import (
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
)

// options are the benchmark's flags.
type options struct {
	Only    string
	JSON    string
	Workers int

	SessionPods   int
	Conversations int
	TurnsPerConv  int
	Concurrency   int
	Keys          int

	OverloadPods int
	PodTPS       float64
	SLOTPS       int
	Clients      int
	StreamTokens int
	Warmup       time.Duration
	Window       time.Duration

	CostRequests int
	CostRounds   int
	CostWarmup   int
	CostPeers    []int
	CostBlock    int
}

var scenarios = []string{"sessions", "overload", "cost"}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("benchengine", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: go run ./hack/benchengine [flags]\n\n"+
			"Measures the llm routing engine (deploy/openresty) on a real nginx in front of\n"+
			"simulated pods: session affinity, decode-SLO admission under overload, and the\n"+
			"cost per request. Prints a markdown report on stdout; progress on stderr.\n\nflags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&o.Only, "only", "", "run only these scenarios, comma-separated: sessions, overload, cost (default: all)")
	fs.StringVar(&o.JSON, "json", "", "also write the numbers as JSON to this `file`")
	fs.IntVar(&o.Workers, "workers", 2, "nginx worker processes")
	fs.IntVar(&o.SessionPods, "session-pods", 8, "sessions: simulated pods behind the route")
	fs.IntVar(&o.Conversations, "conversations", 240, "sessions: conversations per placement variant")
	fs.IntVar(&o.TurnsPerConv, "turns", 5, "sessions: turns per conversation")
	fs.IntVar(&o.Concurrency, "concurrency", 16, "sessions: conversations running at once")
	fs.IntVar(&o.Keys, "keys", 400, "sessions: session keys placed (one request each) for the pod removal and return")
	fs.IntVar(&o.OverloadPods, "overload-pods", 2, "overload: simulated pods behind the route")
	fs.Float64Var(&o.PodTPS, "pod-tps", 300, "overload: each pod's decode capacity, tokens/s (shared by its streams)")
	fs.IntVar(&o.SLOTPS, "slo-tps", 30, "overload: the route's spec.slo.decodeTokensPerSecond")
	fs.IntVar(&o.Clients, "clients", 40, "overload: concurrent clients, each looping streamed requests")
	fs.IntVar(&o.StreamTokens, "stream-tokens", 60, "overload: tokens per streamed answer (max_tokens)")
	fs.DurationVar(&o.Warmup, "warmup", 5*time.Second, "overload: load before the measured window (not measured)")
	fs.DurationVar(&o.Window, "window", 20*time.Second, "overload: the measured window")
	fs.IntVar(&o.CostRequests, "cost-requests", 2000, "cost: sequential requests per route, request kind and round")
	fs.IntVar(&o.CostRounds, "cost-rounds", 3, "cost: rounds (the median of the rounds' means is reported)")
	fs.IntVar(&o.CostBlock, "cost-block", 100, "cost: a round's requests go in blocks of this many, every route and kind in turn")
	fs.IntVar(&o.CostWarmup, "cost-warmup", 300, "cost: unmeasured requests per route and kind before the first round")
	peers := fs.String("cost-peers", "10,10000", "cost: the engine routes' peer counts, comma-separated (at most 10,000; the first is held against plain, the last against the first)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	for _, f := range strings.Split(*peers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 10000 {
			return nil, fmt.Errorf("-cost-peers: %q is not a peer count from 1 to 10000", f)
		}
		o.CostPeers = append(o.CostPeers, n)
	}
	slices.Sort(o.CostPeers)
	o.CostPeers = slices.Compact(o.CostPeers)
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	for _, s := range o.selected() {
		if !contains(scenarios, s) {
			return nil, fmt.Errorf("-only: unknown scenario %q (want %s)", s, strings.Join(scenarios, ", "))
		}
	}
	for _, c := range []struct {
		name string
		v    int
		min  int
	}{
		{"workers", o.Workers, 1}, {"session-pods", o.SessionPods, 2}, {"conversations", o.Conversations, 1},
		{"turns", o.TurnsPerConv, 2}, {"concurrency", o.Concurrency, 1}, {"keys", o.Keys, 1},
		{"overload-pods", o.OverloadPods, 1}, {"slo-tps", o.SLOTPS, 1}, {"clients", o.Clients, 1},
		{"stream-tokens", o.StreamTokens, 2}, {"cost-requests", o.CostRequests, 1}, {"cost-rounds", o.CostRounds, 1},
		{"cost-warmup", o.CostWarmup, 0}, {"cost-block", o.CostBlock, 1},
	} {
		if c.v < c.min {
			return nil, fmt.Errorf("-%s %d: want at least %d", c.name, c.v, c.min)
		}
	}
	if o.PodTPS <= 0 || o.Window <= 0 || o.Warmup < 0 {
		return nil, fmt.Errorf("-pod-tps and -window must be positive, -warmup not negative")
	}
	return o, nil
}

// selected are the scenarios to run.
func (o *options) selected() []string {
	if strings.TrimSpace(o.Only) == "" {
		return scenarios
	}
	var out []string
	for _, s := range strings.Split(o.Only, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func contains(xs []string, x string) bool { return slices.Contains(xs, x) }

// report is everything one run measured.
type report struct {
	Command string    `json:"command"`
	CPUs    int       `json:"cpus"`
	Workers int       `json:"nginx_workers"`
	Started time.Time `json:"started"`
	Seconds float64   `json:"seconds"`
	// Engine names the lua engine measured: the commit, the files of
	// deploy/openresty changed in the working tree, and a hash of the
	// lua files' contents (two runs with one hash ran one engine).
	Engine string `json:"engine"`
	// LoadStart and LoadEnd are the 1-minute load average (/proc/loadavg).
	LoadStart string          `json:"load_average_start"`
	LoadEnd   string          `json:"load_average_end"`
	Sessions  *sessionsResult `json:"sessions,omitempty"`
	Overload  *overloadResult `json:"overload,omitempty"`
	Cost      *costResult     `json:"cost,omitempty"`
	Goals     []goal          `json:"goals"`
	Errors    []string        `json:"errors,omitempty"`
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err == flag.ErrHelp {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchengine: %v\n", err)
		os.Exit(2)
	}
	os.Exit(run(o))
}

func run(o *options) int {
	rep := &report{
		Command: "go run ./hack/benchengine" + argString(os.Args[1:]),
		CPUs:    runtime.NumCPU(), Workers: o.Workers, Started: time.Now(),
		LoadStart: loadAverage(), Engine: engineVersion(),
	}
	g, err := startRig(o.Workers)
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchengine: %v\n", err)
		return 1
	}
	// An interrupt stops nginx before the program ends.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		logf("interrupted: stopping nginx")
		g.close()
		os.Exit(130)
	}()
	defer g.close()

	fail := func(err error) {
		logf("%v", err)
		rep.Errors = append(rep.Errors, err.Error())
	}
	sel := o.selected()
	if contains(sel, "sessions") {
		r, err := runSessions(g, o)
		rep.Sessions = r
		if err != nil {
			fail(err)
		}
	}
	if contains(sel, "overload") {
		r, err := runOverload(g, o)
		rep.Overload = r
		if err != nil {
			fail(err)
		}
	}
	if contains(sel, "cost") {
		r, err := runCost(g, o)
		rep.Cost = r
		if err != nil {
			fail(err)
		}
	}
	rep.Seconds = time.Since(rep.Started).Seconds()
	rep.LoadEnd = loadAverage()
	rep.Goals = goals(rep)
	writeReport(os.Stdout, rep, o)
	if o.JSON != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err == nil {
			err = os.WriteFile(o.JSON, append(b, '\n'), 0o644)
		}
		if err != nil {
			logf("write %s: %v", o.JSON, err)
			return 1
		}
	}
	if len(rep.Errors) > 0 {
		return 1
	}
	return 0
}

// argString is the flags as a shell would take them back.
func argString(args []string) string {
	var b strings.Builder
	for _, a := range args {
		b.WriteByte(' ')
		if a == "" || strings.ContainsAny(a, " \t\"'$\\") {
			fmt.Fprintf(&b, "%q", a)
		} else {
			b.WriteString(a)
		}
	}
	return b.String()
}

// loadAverage is the 1-minute load average, "?" when unknown.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// engineVersion names the engine in deploy/openresty: the commit, the
// files changed since it, and the sha256 of the lua files (their names
// and contents, in name order).
func engineVersion() string {
	dir := nginxtest.RepoDir()
	h := sha256.New()
	files, _ := filepath.Glob(filepath.Join(dir, "deploy", "openresty", "lua", "*.lua"))
	files = append(files, filepath.Join(dir, "deploy", "openresty", "nginx.conf"))
	slices.Sort(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		fmt.Fprintf(h, "%s %d\n", filepath.Base(f), len(b))
		h.Write(b)
	}
	out := fmt.Sprintf("lua sha256 %x", h.Sum(nil)[:6])
	if rev, err := exec.Command("git", "-C", dir, "rev-parse", "--short", "HEAD").Output(); err == nil {
		out = "commit " + strings.TrimSpace(string(rev)) + ", " + out
	}
	if st, err := exec.Command("git", "-C", dir, "status", "--porcelain", "--", "deploy/openresty").Output(); err == nil {
		var changed []string
		for _, l := range strings.Split(strings.TrimSpace(string(st)), "\n") {
			if len(l) > 3 {
				changed = append(changed, filepath.Base(strings.TrimSpace(l[3:])))
			}
		}
		if len(changed) > 0 {
			out += ", changed in the working tree: " + strings.Join(changed, " ")
		}
	}
	return out
}
