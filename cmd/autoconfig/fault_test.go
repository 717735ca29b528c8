package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/modelsphere/autoconfig/internal/testenv"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// The fault test (make fault): two replicas with the chart's arguments,
// each behind its own TCP proxy, 40 routes whose EndpointSlices change
// every 500 ms, through five faults — the leader killed (SIGKILL), the
// leader cut off for 20 s, a graceful handover (SIGTERM), 10 s without the
// API server for both, and a graceful handover while the standby is cut
// off for 10 s (it takes the Lease as soon as it is back). A replica that exits is restarted 2 s later, as its
// pod would be. Checked throughout: no ConfigMap write leaves a route's
// key missing or empty or takes it back to older endpoints (a watch sees
// every write), and no replica writes a
// ConfigMap while it does not hold the Lease (the API server's audit log
// names the writer of every ConfigMap and Lease write); after each fault,
// every key catches up with the endpoints it missed; at the end, with the
// churn stopped, every key holds its route's last endpoints. The figures
// (time to converge after each fault, writes) are logged.
//
// It runs only with AUTOCONFIG_FAULT=1 (make fault: about 90 s).

const (
	faultNS     = "fault"
	faultRoutes = 40
	faultCMs    = 4
)

// chartArgs are the controller arguments of the Helm chart with its
// default values (deploy/helm/autoconfig/templates/deployment.yaml).
var chartArgs = []string{"--leader-elect=true", "--leader-election-namespace=" + faultNS,
	"--leader-elect-lease-duration=15s", "--leader-elect-renew-deadline=10s", "--leader-elect-retry-period=2s",
	"--log-level=info", "--kube-api-qps=500", "--kube-api-burst=1000"}

const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Request
  resources: [{group: "coordination.k8s.io", resources: ["leases"]}]
  verbs: ["create", "update", "patch"]
- level: Metadata
  resources: [{group: "", resources: ["configmaps"]}]
  verbs: ["create", "update", "patch"]
- level: None
`

// faultReplica is one controller "pod": its proxy, its user, and the
// process of its current incarnation, restarted when it exits.
type faultReplica struct {
	t     *testing.T
	name  string
	proxy *testenv.TCPProxy
	kc    string

	mu       sync.Mutex
	proc     *controllerProc
	gen      int
	stopping bool
	held     bool // an exited process is not restarted until released
	exits    []string
}

func (r *faultReplica) hold(h bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held = h
}

func (r *faultReplica) start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	p := startController(r.t, fmt.Sprintf("%s#%d", r.name, r.gen), append([]string{"--kubeconfig", r.kc}, chartArgs...)...)
	r.proc = p
	go func() {
		<-p.done
		r.mu.Lock()
		stopping := r.stopping
		r.exits = append(r.exits, fmt.Sprintf("%s: %v", p.name, p.err))
		r.mu.Unlock()
		if stopping {
			return
		}
		time.Sleep(2 * time.Second) // the kubelet restarts the container
		r.mu.Lock()
		for r.held && !r.stopping {
			r.mu.Unlock()
			time.Sleep(100 * time.Millisecond)
			r.mu.Lock()
		}
		cur := r.proc == p && !r.stopping
		r.mu.Unlock()
		if cur {
			r.start()
		}
	}()
}

// waitReady waits until the replica's current process is ready (a
// process that exited is replaced first).
func (r *faultReplica) waitReady(timeout time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if p := r.current(); !p.exited() && p.probe("/readyz") == 200 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s not ready within %v", r.name, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (r *faultReplica) current() *controllerProc {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc
}

// leads: the current process acquired the Lease (a process that loses
// it exits).
func (r *faultReplica) leads() bool {
	p := r.current()
	return !p.exited() && strings.Contains(p.out.String(), "Successfully acquired lease")
}

type reach struct {
	at  time.Time
	gen int
}

// faultWorld is the cluster side: routes, the churn, the watch.
type faultWorld struct {
	sc *scriptCluster
	cs *kubernetes.Clientset

	mu   sync.Mutex
	gens [faultRoutes]int // each route's EndpointSlice generation
	// seen: each key's generation in the ConfigMaps, by the watch.
	seen [faultRoutes]int
	// reached: when each key first held each newer generation.
	reached   [faultRoutes][]reach
	bad       []string // writes that left a key missing or empty
	stale     []string // writes that took a key back to older endpoints
	cmWrites  int
	churnDone int
}

var faultIP = regexp.MustCompile(`\b10\.(\d+)\.(\d+)\.(\d+)\b`)

func faultEndpoint(route, gen int) string {
	return fmt.Sprintf("10.%d.%d.%d", gen/250, gen%250, route+1)
}

func routeName(r int) string { return fmt.Sprintf("route-%02d", r) }
func routeKey(r int) string  { return "session_route_" + routeName(r) + ".conf" }

func (w *faultWorld) fixture() string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n", faultNS)
	for c := range faultCMs {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: routes-%d, namespace: %s}\n", c, faultNS)
	}
	for r := range faultRoutes {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Service
metadata: {name: svc-%[1]d, namespace: %[2]s}
spec:
  ports: [{name: http, port: 8000, targetPort: 8000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-%[1]d-1
  namespace: %[2]s
  labels: {kubernetes.io/service-name: svc-%[1]d}
addressType: IPv4
ports: [{name: http, port: 8000, protocol: TCP}]
endpoints:
- addresses: [%[3]s]
  conditions: {ready: true}
---
apiVersion: routing.modelsphere.dev/v1alpha1
kind: ModelRoute
metadata: {name: %[4]s, namespace: %[2]s}
spec:
  modelType: video
  discovery: {service: svc-%[1]d}
  nginx:
    outputConfigMap: routes-%[5]d
    peers:
    - {use: backend}
`, r, faultNS, faultEndpoint(r, 0), routeName(r), r%faultCMs)
	}
	return b.String()
}

// churn changes one route's EndpointSlice every 500 ms, round robin,
// until ctx ends.
func (w *faultWorld) churn(ctx context.Context, t *testing.T) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for r := 0; ; r = (r + 1) % faultRoutes {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		w.mu.Lock()
		gen := w.gens[r] + 1
		w.mu.Unlock()
		var s discoveryv1.EndpointSlice
		if err := w.sc.admin.Get(ctx, client.ObjectKey{Namespace: faultNS, Name: fmt.Sprintf("svc-%d-1", r)}, &s); err != nil {
			continue
		}
		ready := true
		s.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{faultEndpoint(r, gen)}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}}
		if err := w.sc.admin.Update(ctx, &s); err != nil {
			if ctx.Err() == nil {
				t.Logf("churn: %v", err)
			}
			continue
		}
		w.mu.Lock()
		w.gens[r] = gen
		w.churnDone++
		w.mu.Unlock()
	}
}

// watchConfigMaps checks every write of the output ConfigMaps: each of
// its routes' keys present and holding an endpoint.
func (w *faultWorld) watchConfigMaps(ctx context.Context) error {
	var l corev1.ConfigMapList
	if err := w.sc.admin.List(ctx, &l, client.InNamespace(faultNS)); err != nil {
		return err
	}
	rv := l.ResourceVersion
	go func() {
		for ctx.Err() == nil {
			wt, err := w.cs.CoreV1().ConfigMaps(faultNS).Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range wt.ResultChan() {
				cm, ok := ev.Object.(*corev1.ConfigMap)
				if !ok {
					continue
				}
				rv = cm.ResourceVersion
				if ev.Type != watch.Modified || !strings.HasPrefix(cm.Name, "routes-") {
					continue
				}
				w.check(cm)
			}
			wt.Stop()
		}
	}()
	return nil
}

func (w *faultWorld) check(cm *corev1.ConfigMap) {
	c, _ := strconv.Atoi(strings.TrimPrefix(cm.Name, "routes-"))
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cmWrites++
	started := 0
	for r := c; r < faultRoutes; r += faultCMs {
		if w.seen[r] > 0 || cm.Data[routeKey(r)] != "" {
			started++
		}
	}
	if started == 0 {
		return // the first writes, before any key
	}
	for r := c; r < faultRoutes; r += faultCMs {
		v, ok := cm.Data[routeKey(r)]
		if !ok || v == "" {
			if w.seen[r] > 0 {
				w.bad = append(w.bad, fmt.Sprintf("%s rv %s: key %s missing or empty", cm.Name, cm.ResourceVersion, routeKey(r)))
			}
			continue
		}
		// The route's endpoint is 10.<gen/250>.<gen%250>.<route+1>.
		gen := -1
		for _, m := range faultIP.FindAllStringSubmatch(v, -1) {
			g1, _ := strconv.Atoi(m[1])
			g2, _ := strconv.Atoi(m[2])
			if last, _ := strconv.Atoi(m[3]); last == r+1 {
				gen = max(gen, g1*250+g2)
			}
		}
		if gen < 0 {
			w.bad = append(w.bad, fmt.Sprintf("%s rv %s: key %s holds no endpoint of the route: %q", cm.Name, cm.ResourceVersion, routeKey(r), v))
			continue
		}
		if gen+1 < w.seen[r] {
			// A write of older endpoints over newer ones: written from a
			// stale cache.
			w.stale = append(w.stale, fmt.Sprintf("%s rv %s: key %s went back from %s to %s", cm.Name, cm.ResourceVersion, routeKey(r),
				faultEndpoint(r, w.seen[r]-1), faultEndpoint(r, gen)))
		}
		if gen+1 > w.seen[r] {
			w.reached[r] = append(w.reached[r], reach{time.Now(), gen})
		}
		w.seen[r] = gen + 1 // +1: 0 is "never seen"
	}
}

// behind: the routes whose key is older than want (generations).
func (w *faultWorld) behind(want [faultRoutes]int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for r := range faultRoutes {
		if w.seen[r]-1 < want[r] {
			n++
		}
	}
	return n
}

func (w *faultWorld) snapshot() [faultRoutes]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gens
}

// waitConverged waits until every key holds at least want; it returns
// when the last of them got there (as the watch saw it), or fails after
// timeout.
func (w *faultWorld) waitConverged(t *testing.T, want [faultRoutes]int, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if w.behind(want) == 0 {
			w.mu.Lock()
			defer w.mu.Unlock()
			var last time.Time
			for r := range faultRoutes {
				for _, x := range w.reached[r] {
					if x.gen >= want[r] {
						if x.at.After(last) {
							last = x.at
						}
						break
					}
				}
			}
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys behind %v after the fault", w.behind(want), timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// auditEvent is what the fault test reads of the API server's audit log.
type auditEvent struct {
	Stage string `json:"stage"`
	Verb  string `json:"verb"`
	User  struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef struct {
		Resource  string `json:"resource"`
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	Received      metav1.MicroTime `json:"requestReceivedTimestamp"`
	Completed     metav1.MicroTime `json:"stageTimestamp"`
	RequestObject *struct {
		Spec struct {
			HolderIdentity       *string           `json:"holderIdentity"`
			LeaseDurationSeconds *int32            `json:"leaseDurationSeconds"`
			RenewTime            *metav1.MicroTime `json:"renewTime"`
		} `json:"spec"`
	} `json:"requestObject"`
}

// splitBrain reads the audit log: every successful ConfigMap write in the
// test namespace must come from the user whose Lease write was the last
// before it, naming a holder, and within that Lease's duration. It
// returns the violations and the ConfigMap writes per user.
func splitBrain(t *testing.T, path string) (bad []string, writes map[string]int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var evs []auditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e auditEvent
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Stage != "ResponseComplete" || e.ObjectRef.Namespace != faultNS ||
			e.ResponseStatus.Code < 200 || e.ResponseStatus.Code > 299 || !strings.HasPrefix(e.User.Username, "replica-") {
			continue
		}
		evs = append(evs, e)
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Completed.Before(&evs[j].Completed) })
	writes = map[string]int{}
	for i := range evs {
		e := &evs[i]
		switch e.ObjectRef.Resource {
		case "configmaps":
			writes[e.User.Username]++
			// The Lease write that was last when this write arrived.
			var holder *auditEvent
			for j := i; j >= 0; j-- {
				if evs[j].ObjectRef.Resource == "leases" && evs[j].ObjectRef.Name == LeaderElectionID && !e.Received.Before(&evs[j].Completed) {
					holder = &evs[j]
					break
				}
			}
			switch {
			case holder == nil:
				bad = append(bad, fmt.Sprintf("%s wrote %s at %s before any Lease write", e.User.Username, e.ObjectRef.Name, e.Received.Format(time.RFC3339Nano)))
			case holder.User.Username != e.User.Username:
				bad = append(bad, fmt.Sprintf("%s wrote %s at %s, but the Lease was last written by %s at %s", e.User.Username, e.ObjectRef.Name,
					e.Received.Format(time.RFC3339Nano), holder.User.Username, holder.Completed.Format(time.RFC3339Nano)))
			case holder.RequestObject == nil || holder.RequestObject.Spec.HolderIdentity == nil || *holder.RequestObject.Spec.HolderIdentity == "":
				bad = append(bad, fmt.Sprintf("%s wrote %s at %s after releasing the Lease", e.User.Username, e.ObjectRef.Name, e.Received.Format(time.RFC3339Nano)))
			case holder.RequestObject.Spec.RenewTime != nil && holder.RequestObject.Spec.LeaseDurationSeconds != nil &&
				e.Received.After(holder.RequestObject.Spec.RenewTime.Add(time.Duration(*holder.RequestObject.Spec.LeaseDurationSeconds)*time.Second)):
				bad = append(bad, fmt.Sprintf("%s wrote %s at %s, after its Lease (renewed %s) expired", e.User.Username, e.ObjectRef.Name,
					e.Received.Format(time.RFC3339Nano), holder.RequestObject.Spec.RenewTime.Format(time.RFC3339Nano)))
			}
		}
	}
	return bad, writes
}

func auditWrites(t *testing.T, path string, from, to time.Time) map[string]int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e auditEvent
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Stage != "ResponseComplete" || e.ObjectRef.Namespace != faultNS ||
			e.ObjectRef.Resource != "configmaps" || e.ResponseStatus.Code > 299 || !strings.HasPrefix(e.User.Username, "replica-") {
			continue
		}
		if at := e.Completed.Time; at.After(from) && at.Before(to) {
			out[e.User.Username]++
		}
	}
	return out
}

// startAuditedCluster is an API server that writes an audit log of Lease
// and ConfigMap writes.
func startAuditedCluster(t *testing.T) (*scriptCluster, string) {
	t.Helper()
	env, err := testenv.Environment()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	auditLog := filepath.Join(dir, "audit.log")
	env.ControlPlane.GetAPIServer().Configure().Set("audit-policy-file", policy).Set("audit-log-path", auditLog)
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return &scriptCluster{env: env, host: cfg.Host, admin: admin, owned: map[string]bool{}}, auditLog
}

type faultFigure struct {
	name                 string
	faultSeconds         float64 // how long the fault lasted
	convergedAfterEnd    float64 // from the fault's end until every key held what its route had 1 s after it
	acquired             string  // who leads afterwards
	acquiredAfterBegin   float64 // when it acquired the Lease, from the fault's begin (negative: before)
	cmWrites             map[string]int
	restarts             int
	churnDuring          int
	convergedAfterBegins float64
}

var acquiredLine = regexp.MustCompile(`time=(\S+) level=INFO msg="Successfully acquired lease"`)

// acquiredAt is when p logged that it acquired the Lease.
func acquiredAt(p *controllerProc) time.Time {
	m := acquiredLine.FindStringSubmatch(p.out.String())
	if m == nil {
		return time.Time{}
	}
	at, _ := time.Parse(time.RFC3339Nano, m[1])
	return at
}

func TestFaultsWithChurn(t *testing.T) {
	if os.Getenv("AUTOCONFIG_FAULT") == "" {
		t.Skip("the fault test runs with AUTOCONFIG_FAULT=1 (make fault)")
	}
	sc, auditLog := startAuditedCluster(t)
	cs, err := kubernetes.NewForConfig(sc.env.Config)
	if err != nil {
		t.Fatal(err)
	}
	w := &faultWorld{sc: sc, cs: cs}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := sc.apply(w.fixture()); err != nil {
		t.Fatal(err)
	}
	if err := w.watchConfigMaps(ctx); err != nil {
		t.Fatal(err)
	}
	kdir := t.TempDir()
	target := kubeconfigTarget(t, func() string {
		u, err := sc.env.AddUser(envtest.User{Name: "replica-probe", Groups: []string{"system:masters"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		p, err := writeKubeconfig(u, filepath.Join(kdir, "probe"))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}())
	var reps []*faultReplica
	for _, name := range []string{"a", "b"} {
		u, err := sc.env.AddUser(envtest.User{Name: "replica-" + name, Groups: []string{"system:masters"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		kc, err := writeKubeconfig(u, filepath.Join(kdir, name))
		if err != nil {
			t.Fatal(err)
		}
		p := testenv.NewTCPProxy(t, target, testenv.ProxyForward)
		pkc, _ := proxiedKubeconfig(t, kc, p.Addr())
		reps = append(reps, &faultReplica{t: t, name: "replica-" + name, proxy: p, kc: pkc})
	}
	defer func() {
		for _, r := range reps {
			r.mu.Lock()
			r.stopping = true
			p := r.proc
			r.mu.Unlock()
			if p != nil && !p.exited() {
				_ = p.cmd.Process.Signal(syscall.SIGTERM)
				p.wait(30 * time.Second)
			}
		}
	}()
	start := time.Now()
	for _, r := range reps {
		r.start()
	}
	w.waitConverged(t, w.snapshot(), 120*time.Second)
	t.Logf("setup: every key written %.1f s after the replicas started", time.Since(start).Seconds())
	for _, r := range reps {
		r.waitReady(60 * time.Second)
	}
	go w.churn(ctx, t)

	leader := func() *faultReplica {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			for _, r := range reps {
				if r.leads() {
					return r
				}
			}
			if time.Now().After(deadline) {
				t.Fatal("no replica leads")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	other := func(r *faultReplica) *faultReplica {
		if r == reps[0] {
			return reps[1]
		}
		return reps[0]
	}
	// settle: both replicas run and are ready, one leads, and every key
	// caught up.
	settle := func() {
		t.Helper()
		for _, r := range reps {
			r.waitReady(90 * time.Second)
		}
		leader()
		w.waitConverged(t, w.snapshot(), 60*time.Second)
		time.Sleep(3 * time.Second)
	}
	settle()

	var figures []faultFigure
	run := func(name string, fault func(l *faultReplica) (begin, end time.Time)) {
		t.Helper()
		l := leader()
		restarts := len(l.exits) + len(other(l).exits)
		w.mu.Lock()
		churn0 := w.churnDone
		w.mu.Unlock()
		begin, end := fault(l)
		// Caught up: every key holds at least what its route had 1 s
		// after the fault ended (two changes later).
		time.Sleep(time.Second)
		want := w.snapshot()
		conv := w.waitConverged(t, want, 120*time.Second)
		w.mu.Lock()
		churn := w.churnDone - churn0
		w.mu.Unlock()
		now := leader()
		acq := acquiredAt(now.current())
		f := faultFigure{acquiredAfterBegin: acq.Sub(begin).Seconds(), name: name, faultSeconds: end.Sub(begin).Seconds(), convergedAfterEnd: conv.Sub(end).Seconds(),
			convergedAfterBegins: conv.Sub(begin).Seconds(), acquired: now.name,
			cmWrites: auditWrites(t, auditLog, begin, conv), restarts: len(l.exits) + len(other(l).exits) - restarts, churnDuring: churn}
		figures = append(figures, f)
		t.Logf("%s: converged %.2f s after the fault ended (%.2f s after it began); leader now %s (Lease acquired %+.2f s after the fault began); ConfigMap writes until converged %v; process exits %d",
			name, f.convergedAfterEnd, f.convergedAfterBegins, f.acquired, f.acquiredAfterBegin, f.cmWrites, f.restarts)
		settle()
	}

	run("leader SIGKILL", func(l *faultReplica) (time.Time, time.Time) {
		p := l.current()
		now := time.Now()
		_ = p.cmd.Process.Kill()
		return now, now
	})
	run("leader cut off 20 s", func(l *faultReplica) (time.Time, time.Time) {
		begin := time.Now()
		l.proxy.SetMode(testenv.ProxyRefuse)
		time.Sleep(20 * time.Second)
		l.proxy.SetMode(testenv.ProxyForward)
		return begin, time.Now()
	})
	run("graceful handover (SIGTERM)", func(l *faultReplica) (time.Time, time.Time) {
		p := l.current()
		now := time.Now()
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		return now, now
	})
	run("API server away 10 s", func(*faultReplica) (time.Time, time.Time) {
		begin := time.Now()
		for _, r := range reps {
			r.proxy.SetMode(testenv.ProxyRefuse)
		}
		time.Sleep(10 * time.Second)
		for _, r := range reps {
			r.proxy.SetMode(testenv.ProxyForward)
		}
		return begin, time.Now()
	})

	run("graceful handover while the standby is cut off 10 s", func(l *faultReplica) (time.Time, time.Time) {
		// The standby takes the released Lease as soon as it is back,
		// with caches that missed 10 s of changes (the old leader's
		// restart is held back until then).
		s := other(l)
		begin := time.Now()
		s.proxy.SetMode(testenv.ProxyRefuse)
		l.hold(true)
		_ = l.current().cmd.Process.Signal(syscall.SIGTERM)
		time.Sleep(10 * time.Second)
		s.proxy.SetMode(testenv.ProxyForward)
		end := time.Now()
		deadline := time.Now().Add(60 * time.Second)
		for !s.leads() && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		l.hold(false)
		return begin, end
	})

	// The churn stops: every key holds its route's last endpoints.
	cancel()
	time.Sleep(time.Second)
	final := w.snapshot()
	w.waitConverged(t, final, 60*time.Second)
	w.mu.Lock()
	bad, stale, churn, cmWrites := append([]string(nil), w.bad...), append([]string(nil), w.stale...), w.churnDone, w.cmWrites
	w.mu.Unlock()
	for _, b := range bad {
		t.Errorf("lost or empty: %s", b)
	}
	for _, b := range stale {
		t.Errorf("stale write: %s", b)
	}
	brain, writes := splitBrain(t, auditLog)
	for _, b := range brain {
		t.Errorf("split brain: %s", b)
	}
	t.Logf("%d EndpointSlice changes, %d ConfigMap writes seen by the watch; ConfigMap writes by replica (audit): %v", churn, cmWrites, writes)
	t.Logf("| fault | lasted s | leader afterwards: Lease acquired s after the fault began | converged s after the fault ended | after it began | ConfigMap writes until converged | process exits |")
	for _, f := range figures {
		t.Logf("| %s | %.1f | %s %+.2f | %.2f | %.2f | %v | %d |", f.name, f.faultSeconds, f.acquired, f.acquiredAfterBegin, f.convergedAfterEnd, f.convergedAfterBegins, f.cmWrites, f.restarts)
	}
	for _, r := range reps {
		r.mu.Lock()
		t.Logf("%s exits: %v", r.name, r.exits)
		r.mu.Unlock()
	}
}

// TestSplitBrainCheck: the fault test's audit check flags a ConfigMap
// write by a replica that does not hold the Lease, has released it, or
// whose Lease expired, and passes the writes of the holder.
func TestSplitBrainCheck(t *testing.T) {
	at := func(s float64) string {
		return time.Date(2026, 12, 3, 4, 0, 0, 0, time.UTC).Add(time.Duration(s * float64(time.Second))).Format("2006-01-02T15:04:05.000000Z")
	}
	lease := func(user string, s float64, holder string) string {
		return fmt.Sprintf(`{"stage":"ResponseComplete","verb":"update","user":{"username":%q},"objectRef":{"resource":"leases","namespace":%q,"name":%q},"responseStatus":{"code":200},"requestReceivedTimestamp":%q,"stageTimestamp":%q,"requestObject":{"spec":{"holderIdentity":%q,"leaseDurationSeconds":15,"renewTime":%q}}}`,
			user, faultNS, LeaderElectionID, at(s), at(s+0.001), holder, at(s))
	}
	cm := func(user string, s float64) string {
		return fmt.Sprintf(`{"stage":"ResponseComplete","verb":"patch","user":{"username":%q},"objectRef":{"resource":"configmaps","namespace":%q,"name":"routes-0"},"responseStatus":{"code":200},"requestReceivedTimestamp":%q,"stageTimestamp":%q}`,
			user, faultNS, at(s), at(s+0.002))
	}
	for _, tc := range []struct {
		name  string
		lines []string
		bad   int
	}{
		{"the holder writes", []string{lease("replica-a", 0, "a_1"), cm("replica-a", 1), lease("replica-a", 2, "a_1"), cm("replica-a", 3)}, 0},
		{"a takeover, then the new holder writes", []string{lease("replica-a", 0, "a_1"), cm("replica-a", 1), lease("replica-b", 20, "b_1"), cm("replica-b", 21)}, 0},
		{"the old holder writes after the takeover", []string{lease("replica-a", 0, "a_1"), lease("replica-b", 20, "b_1"), cm("replica-a", 21)}, 1},
		{"a write after releasing the Lease", []string{lease("replica-a", 0, "a_1"), lease("replica-a", 5, ""), cm("replica-a", 6)}, 1},
		{"a write after the Lease expired", []string{lease("replica-a", 0, "a_1"), cm("replica-a", 16)}, 1},
		{"a write before any Lease", []string{cm("replica-a", 0)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.log")
			if err := os.WriteFile(path, []byte(strings.Join(tc.lines, "\n")+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			bad, _ := splitBrain(t, path)
			if len(bad) != tc.bad {
				t.Errorf("%d violations, want %d: %v", len(bad), tc.bad, bad)
			}
		})
	}
}
