package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/schema/routespec"

	"github.com/modelsphere/autoconfig/hack/scale/procmem"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// clkTck is the kernel's clock tick (USER_HZ) of /proc/<pid>/stat times.
const clkTck = 100

// procCPU reads the CPU seconds (user + system) a process has used.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// the fields after its closing parenthesis start at field 3 (state).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return float64(utime+stime) / clkTck, nil
}

// phaseVar is the current phase of a run (setup, sync, idle, rollout,
// done), read by the sampler and the watcher to attribute what they see.
type phaseVar struct{ v atomic.Value }

func (p *phaseVar) set(s string) { p.v.Store(s) }
func (p *phaseVar) get() string {
	s, _ := p.v.Load().(string)
	return s
}

// proc is a subprocess with its output in a log file.
type proc struct{ *testbin.Proc }

func startProc(name, logPath, bin string, args ...string) (*proc, error) {
	p, err := testbin.StartProc(name, logPath, bin, args...)
	if err != nil {
		return nil, err
	}
	return &proc{p}, nil
}

// stop sends SIGTERM and kills the process if it has not exited after
// 15 s.
func (p *proc) stop() error { return p.Terminate(15 * time.Second) }

// tail is the end of the process's log, for error messages.
func (p *proc) tail() string {
	state := "running"
	if p.Exited() {
		state = "exited: " + p.Cmd.ProcessState.String()
	}
	return fmt.Sprintf("\n  %s (%s) log %s:\n    %s", p.Name, state, p.LogPath, strings.Join(p.LogTail(20, 400), "\n    "))
}

// sampler records the maximum VmRSS of a process per phase.
type sampler struct {
	// cancel ends run (stop).
	cancel context.CancelFunc
	pid    int
	phase  *phaseVar
	mu     sync.Mutex
	max    map[string]int64
	all    int64
	n      int
	err    error
}

func (s *sampler) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		rss, _, err := procmem.Read(s.pid)
		s.mu.Lock()
		if err != nil {
			s.err = err
		} else {
			s.n++
			s.all = max(s.all, rss)
			ph := s.phase.get()
			s.max[ph] = max(s.max[ph], rss)
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *sampler) stop() {
	if s.cancel != nil {
		s.cancel()
	}
}

func (s *sampler) maxOf(phase string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max[phase]
}

// needle is how a route file names one endpoint, by model type: the lua
// peer entry of an llm route, the upstream server line of a video route.
func needle(modelType, ip string, port int) string {
	if modelType == "video" {
		return fmt.Sprintf("server %s:%d ", ip, port)
	}
	return fmt.Sprintf(`[ "host" ] = "%s", [ "port" ] = %d }`, ip, port)
}

// checkNeedles renders a route with the compiler and checks that needle
// finds its endpoints, so a change of the rendered format fails at once
// instead of as a timeout.
func checkNeedles(modelType string) error {
	l := layout{routes: 1, cms: 1, pods: 2, nodes: 1, nss: 1, sliceSize: 100, modelType: modelType}
	rt := route(l, 0)
	eps := []compiler.Endpoint{{IP: podIP(0, 0), Port: backendPort, Ready: true}, {IP: podIP(0, 10), Port: backendPort, Ready: true}}
	res, err := compiler.Compile(&compiler.Route{Name: rt.Name, Namespace: rt.Namespace, Spec: routespec.Spec(rt.Spec)},
		compiler.Snapshot{Backends: eps}, compiler.Options{})
	if err != nil {
		return fmt.Errorf("self-check: compile a sample route: %w", err)
	}
	if len(res.Outputs) != 1 || res.Outputs[0].Key != l.routeKey(0) {
		return fmt.Errorf("self-check: the sample route renders %d outputs, want one key %s", len(res.Outputs), l.routeKey(0))
	}
	b, err := res.Outputs[0].Render(nil)
	if err != nil {
		return err
	}
	for _, e := range eps {
		if !strings.Contains(string(b), needle(modelType, e.IP, backendPort)) {
			return fmt.Errorf("self-check: the rendered %s route does not contain %q: the route file format changed; update needle() in hack/scale\n%s", modelType, needle(modelType, e.IP, backendPort), b)
		}
	}
	if strings.Contains(string(b), needle(modelType, podIP(0, 1), backendPort)) {
		return errors.New("self-check: needle() finds an endpoint the route does not have")
	}
	return nil
}

// routeExpect is what one route's key must show.
type routeExpect struct {
	route   int
	key     string
	present []string
	absent  []string
}

// expectations are, per ConfigMap, the routes it must hold with their
// current endpoints (and, after the rollout, without the old ones).
func (w *world) expectations() [][]routeExpect {
	l := w.l
	out := make([][]routeExpect, l.cms)
	for r := 0; r < l.routes; r++ {
		e := routeExpect{route: r, key: l.routeKey(r)}
		start, end := l.podRange(r)
		for i := start; i < end; i++ {
			e.present = append(e.present, needle(l.modelType, podIP(w.gen[i], i), backendPort))
			if w.gen[i] > 0 {
				e.absent = append(e.absent, needle(l.modelType, podIP(w.gen[i]-1, i), backendPort))
			}
		}
		out[l.cmOf(r)] = append(out[l.cmOf(r)], e)
	}
	return out
}

// checkCM says whether a ConfigMap shows every expected route; problem
// names the first thing missing. A lost base key is an error.
func checkCM(cm *corev1.ConfigMap, exps []routeExpect) (ok bool, problem string, err error) {
	if _, ok := cm.Data[baseKey]; !ok {
		return false, "", fmt.Errorf("ConfigMap %s/%s lost the consumer's key %s", cm.Namespace, cm.Name, baseKey)
	}
	for _, e := range exps {
		content, ok := cm.Data[e.key]
		if !ok {
			return false, fmt.Sprintf("%s/%s has no key %s", cm.Namespace, cm.Name, e.key), nil
		}
		for _, n := range e.present {
			if !strings.Contains(content, n) {
				return false, fmt.Sprintf("%s/%s key %s lacks %s", cm.Namespace, cm.Name, e.key, n), nil
			}
		}
		for _, n := range e.absent {
			if strings.Contains(content, n) {
				return false, fmt.Sprintf("%s/%s key %s still has %s", cm.Namespace, cm.Name, e.key, n), nil
			}
		}
	}
	return true, "", nil
}

// waitConverged GETs every ConfigMap not yet converged each -poll until
// all show their routes' expected endpoints, and returns when the last
// one was seen converged. The GETs read the API server's watch cache
// (resourceVersion 0), which is current within milliseconds and spares
// etcd. A ConfigMap once converged is not polled again; a final pass
// checks that none went back.
func (b *bench) waitConverged(ctx context.Context, cl *cluster, l layout, exps [][]routeExpect, ctrl *proc, what string) (time.Time, error) {
	pending := map[int]bool{}
	for c := 0; c < l.cms; c++ {
		pending[c] = true
	}
	deadline := time.Now().Add(b.o.Timeout)
	tick := time.NewTicker(b.o.Poll)
	defer tick.Stop()
	var last time.Time
	var problem string
	lastLog := time.Now()
	for {
		var mu sync.Mutex
		var ids []int
		for c := range pending {
			ids = append(ids, c)
		}
		err := parallel(ctx, 8, len(ids), func(ctx context.Context, k int) error {
			c := ids[k]
			cm, err := cl.cs.CoreV1().ConfigMaps(cmNamespace).Get(ctx, l.cmName(c), metav1.GetOptions{ResourceVersion: "0"})
			at := time.Now()
			if err != nil {
				return fmt.Errorf("get configmap %s: %w", l.cmName(c), err)
			}
			ok, p, err := checkCM(cm, exps[c])
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if ok {
				delete(pending, c)
				if at.After(last) {
					last = at
				}
			} else {
				problem = p
			}
			return nil
		})
		if err != nil {
			return time.Time{}, fmt.Errorf("%s: %w", what, err)
		}
		if len(pending) == 0 {
			break
		}
		if ctrl.Exited() {
			return time.Time{}, fmt.Errorf("%s: the controller exited%s", what, ctrl.tail())
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("%s did not converge within %s: %d of %d ConfigMaps incomplete, e.g. %s%s", what, b.o.Timeout, len(pending), l.cms, problem, ctrl.tail())
		}
		if time.Since(lastLog) > 30*time.Second {
			b.logf("  %s: %d of %d ConfigMaps incomplete, e.g. %s", what, len(pending), l.cms, problem)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-tick.C:
		}
	}
	// Final pass: every ConfigMap still shows everything.
	err := parallel(ctx, 8, l.cms, func(ctx context.Context, c int) error {
		cm, err := cl.cs.CoreV1().ConfigMaps(cmNamespace).Get(ctx, l.cmName(c), metav1.GetOptions{ResourceVersion: "0"})
		if err != nil {
			return err
		}
		ok, p, err := checkCM(cm, exps[c])
		if err == nil && !ok {
			err = fmt.Errorf("converged, then went back: %s", p)
		}
		return err
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", what, err)
	}
	return last, nil
}

// apiCount is the API server's request totals (apiserver_request_total).
type apiCount struct {
	All    float64
	Writes float64
	// By is by "VERB resource[/subresource]".
	By map[string]float64
}

var (
	verbRE        = regexp.MustCompile(`[{,]verb="([A-Z]+)"`)
	resourceRE    = regexp.MustCompile(`[{,]resource="([^"]*)"`)
	subresourceRE = regexp.MustCompile(`[{,]subresource="([^"]*)"`)
)

func label(re *regexp.Regexp, line string) string {
	if m := re.FindStringSubmatch(line); m != nil {
		return m[1]
	}
	return ""
}

// scrapeAPI reads the API server's request counters from /metrics.
func scrapeAPI(ctx context.Context, cl *cluster) (apiCount, error) {
	c := apiCount{By: map[string]float64{}}
	b, err := cl.csJSON.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return c, fmt.Errorf("apiserver /metrics: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		c.All += v
		verb, res := label(verbRE, line), label(resourceRE, line)
		if sub := label(subresourceRE, line); sub != "" {
			res += "/" + sub
		}
		if res == "" {
			res = "(non-resource)"
		}
		c.By[verb+" "+res] += v
		// The metric's verbs are POST (create), PUT (update), PATCH,
		// DELETE, DELETECOLLECTION, APPLY, GET, LIST, WATCH.
		switch verb {
		case "POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY", "CREATE", "UPDATE":
			c.Writes += v
		}
	}
	if c.All == 0 {
		return c, errors.New("apiserver /metrics has no apiserver_request_total")
	}
	return c, nil
}

// apiMark is a point in time of the API server's and the benchmark's own
// request counts.
type apiMark struct {
	api         apiCount
	own, ownW   int64
	ok          bool
	scrapeError string
}

func markAPI(ctx context.Context, cl *cluster) apiMark {
	m := apiMark{own: cl.own.all.Load(), ownW: cl.own.writes.Load()}
	a, err := scrapeAPI(ctx, cl)
	if err != nil {
		m.scrapeError = err.Error()
		return m
	}
	m.api, m.ok = a, true
	// The scrape itself is one of our requests.
	m.own++
	return m
}

// apiDelta is the requests the API server served between two marks that
// the benchmark did not send: the controller's, plus the API server's
// own few (leases, its endpoint reconciler). All is every request the API
// server served in that time, the benchmark's included, by verb and
// resource.
type apiDelta struct {
	Requests float64            `json:"requests"`
	Writes   float64            `json:"writes"`
	All      map[string]float64 `json:"allByVerbAndResource"`
}

func deltaAPI(a, b apiMark) *apiDelta {
	if !a.ok || !b.ok {
		return nil
	}
	d := &apiDelta{
		Requests: (b.api.All - a.api.All) - float64(b.own-a.own),
		Writes:   (b.api.Writes - a.api.Writes) - float64(b.ownW-a.ownW),
		All:      map[string]float64{},
	}
	for k, v := range b.api.By {
		if n := v - a.api.By[k]; n != 0 {
			d.All[k] = n
		}
	}
	return d
}

// routesReady lists every ModelRoute from the API server's watch cache
// and says how many are Ready (condition Ready True for the current
// generation); problem names one that is not.
func routesReady(ctx context.Context, cl *cluster) (ready, total int, problem string, err error) {
	b, err := cl.csJSON.CoreV1().RESTClient().Get().AbsPath(modelRoutesPath).Param("resourceVersion", "0").DoRaw(ctx)
	if err != nil {
		return 0, 0, "", fmt.Errorf("list modelroutes: %w", err)
	}
	var list struct {
		Items []struct {
			Metadata struct {
				Namespace  string `json:"namespace"`
				Name       string `json:"name"`
				Generation int64  `json:"generation"`
			} `json:"metadata"`
			Status struct {
				ObservedGeneration int64              `json:"observedGeneration"`
				Conditions         []metav1.Condition `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return 0, 0, "", fmt.Errorf("list modelroutes: %w", err)
	}
	for _, r := range list.Items {
		ok := false
		for _, c := range r.Status.Conditions {
			if c.Type == "Ready" {
				gen := c.ObservedGeneration
				if gen == 0 {
					gen = r.Status.ObservedGeneration
				}
				ok = c.Status == metav1.ConditionTrue && gen >= r.Metadata.Generation
				if !ok && problem == "" {
					problem = fmt.Sprintf("%s/%s Ready=%s (%s) for generation %d of %d", r.Metadata.Namespace, r.Metadata.Name, c.Status, c.Reason, gen, r.Metadata.Generation)
				}
			}
		}
		if ok {
			ready++
		} else if problem == "" {
			problem = fmt.Sprintf("%s/%s has no Ready condition", r.Metadata.Namespace, r.Metadata.Name)
		}
	}
	return ready, len(list.Items), problem, nil
}

// waitRoutesReady lists the routes each -poll until all n are Ready and
// returns when that list was read.
func (b *bench) waitRoutesReady(ctx context.Context, cl *cluster, n int, ctrl *proc, what string) (time.Time, error) {
	deadline := time.Now().Add(b.o.Timeout)
	tick := time.NewTicker(b.o.Poll)
	defer tick.Stop()
	lastLog := time.Now()
	for {
		ready, total, problem, err := routesReady(ctx, cl)
		at := time.Now()
		if err != nil {
			return time.Time{}, fmt.Errorf("%s: %w", what, err)
		}
		if ready == n && total == n {
			return at, nil
		}
		if ctrl.Exited() {
			return time.Time{}, fmt.Errorf("%s: the controller exited%s", what, ctrl.tail())
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("%s: %d of %d routes Ready within %s, e.g. %s%s", what, ready, n, b.o.Timeout, problem, ctrl.tail())
		}
		if time.Since(lastLog) > 30*time.Second {
			b.logf("  %s: %d of %d routes Ready, e.g. %s", what, ready, n, problem)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-tick.C:
		}
	}
}
