package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/controller"
	"github.com/modelsphere/autoconfig/internal/endpoints"
	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/internal/reload/reloadtest"
	servedpkg "github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// peerBackend is one backend pod: it answers its own name, and on
// /stream it sends one line every streamTick for streamLines lines.
type peerBackend struct {
	name string
	port int32
	srv  *http.Server
	hits atomic.Int64
}

const (
	streamLines = 42
	streamTick  = 500 * time.Millisecond // 42 × 0.5 s ≈ 21 s per stream
)

func startPeerBackend(t testing.TB, name string) *peerBackend {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &peerBackend{name: name, port: int32(l.Addr().(*net.TCPAddr).Port)}
	b.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.hits.Add(1)
		if strings.HasSuffix(r.URL.Path, "/stream") {
			f := w.(http.Flusher)
			w.Header().Set("Content-Type", "text/plain")
			for i := range streamLines {
				fmt.Fprintf(w, "%s %d\n", b.name, i)
				f.Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(streamTick):
				}
			}
			return
		}
		io.WriteString(w, b.name+"\n")
	})}
	go b.srv.Serve(l)
	t.Cleanup(func() { b.srv.Close() })
	return b
}

// dynRoutes renders the llm route chat and the video route vid with
// dynamic peers for nginx n, each over its backends.
type dynRoutes struct {
	t     testing.TB
	n     *nginxtest.Nginx
	specs map[string]*compiler.Route
}

func newDynRoutes(t testing.TB, n *nginxtest.Nginx, extraValues string) *dynRoutes {
	t.Helper()
	v, err := schema.Default()
	if err != nil {
		t.Fatal(err)
	}
	d := &dynRoutes{t: t, n: n, specs: map[string]*compiler.Route{}}
	for name, doc := range map[string]string{
		"chat": `apiVersion: routing.modelsphere.dev/v1alpha1
kind: ModelRoute
metadata: {name: chat, namespace: llm}
spec:
  discovery: {service: chat}
  nginx:
    outputConfigMap: routes
    peers: [{use: backend}]
` + extraValues,
		"vid": `apiVersion: routing.modelsphere.dev/v1alpha1
kind: ModelRoute
metadata: {name: vid, namespace: llm}
spec:
  modelType: video
  discovery: {service: vid}
  nginx:
    outputConfigMap: routes
    peers: [{use: backend}]
`,
	} {
		rt, err := v.Validate(name+".yaml", []byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		d.specs[name] = &compiler.Route{Name: rt.Name, Namespace: rt.Namespace, Spec: rt.Spec}
	}
	return d
}

// files renders every route over its backends into ConfigMap keys.
func (d *dynRoutes) files(set map[string][]*peerBackend) map[string]string {
	d.t.Helper()
	out := map[string]string{}
	for name, bs := range set {
		var eps []endpoints.Endpoint
		for _, b := range bs {
			eps = append(eps, endpoints.Endpoint{IP: "127.0.0.1", Port: b.port, Ready: true})
		}
		res, err := compiler.Compile(d.specs[name], compiler.Snapshot{Backends: endpoints.Normalize(eps)}, compiler.Options{SockDir: d.n.SockDir(), DynamicPeers: true})
		if err != nil {
			d.t.Fatal(err)
		}
		for _, o := range res.Outputs {
			b, err := o.Render(nil)
			if err != nil {
				d.t.Fatal(err)
			}
			out[o.Key] = string(b)
		}
	}
	return out
}

// control talks to the engine's control socket.
func control(n *nginxtest.Nginx) *http.Client {
	path := filepath.Join(n.SockDir(), peers.ControlSocket)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}}
}

func tableVersion(t testing.TB, content string) string {
	t.Helper()
	tab, err := peers.Parse([]byte(content))
	if err != nil {
		t.Fatal(err)
	}
	return tab.Version
}

// shuttingDown counts nginx workers of n's master that are shutting down.
func shuttingDown(t testing.TB, n *nginxtest.Nginx) int {
	t.Helper()
	count := 0
	ents, _ := os.ReadDir("/proc")
	master := strconv.Itoa(n.MasterPID())
	for _, e := range ents {
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) < 2 || fields[1] != master {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(string(cmd), "shutting down") {
			count++
		}
	}
	return count
}

// TestDynamicPeersNoReload is issue 27's proof on the shipped data plane
// (deploy/openresty/nginx.conf and router.lua on a real nginx, the real
// reload binary on a kubelet-style volume): 100 endpoint-only changes
// (scale out, scale in, replace) across an llm and a video route while 20
// streams of about 21 s run on peers that stay: no SIGHUP, no worker
// generation shutting down, no stream cut, and after each acknowledged
// change no request reaches a removed peer. Then a spec change still
// reloads and is served, and a restarted nginx serves the last table
// before any push.
func TestDynamicPeersNoReload(t *testing.T) {
	dir := t.TempDir()
	n := nginxtest.Start(t, nginxtest.Options{Reference: true, RoutesDir: dir, Workers: 2})
	d := newDynRoutes(t, n, "")
	stay := map[string][]*peerBackend{
		"chat": {startPeerBackend(t, "chat-stay-0"), startPeerBackend(t, "chat-stay-1")},
		"vid":  {startPeerBackend(t, "vid-stay-0"), startPeerBackend(t, "vid-stay-1")},
	}
	var pool []*peerBackend
	for i := range 12 {
		pool = append(pool, startPeerBackend(t, fmt.Sprintf("extra-%d", i)))
	}
	current := map[string][]*peerBackend{"chat": slices.Clone(stay["chat"]), "vid": slices.Clone(stay["vid"])}
	files := d.files(current)
	reloadtest.KubeletSwap(t, dir, files)
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	ctl := control(n)
	s := startSidecar(t, "--watch", dir, "--process", n.MasterMatch(), "--sock-dir", n.SockDir(), "--check-cmd", checkCmd(n),
		"--debounce", "20ms", "--log-level=debug")
	for _, r := range []string{"chat", "vid"} {
		want := tableVersion(t, files[peers.Key(r)])
		testbin.WaitFor(t, wait, "the start push of "+r, func() bool { return reloadtest.EngineVersion(ctl, r) == want })
	}
	baseHUPs, workers := hups(n), n.WorkerPIDs()

	// 20 streams on the peers that stay (the only peers yet).
	type result struct {
		route string
		lines int
		err   error
	}
	results := make(chan result, 20)
	var streams sync.WaitGroup
	for i := range 20 {
		route := []string{"chat", "vid"}[i%2]
		streams.Add(1)
		go func() {
			defer streams.Done()
			resp, err := http.Get(n.URL(route) + "stream")
			if err != nil {
				results <- result{route, 0, err}
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			lines := 0
			for sc.Scan() {
				lines++
			}
			results <- result{route, lines, sc.Err()}
		}()
	}
	testbin.WaitFor(t, wait, "the streams to start", func() bool {
		var h int64
		for _, bs := range stay {
			for _, b := range bs {
				h += b.hits.Load()
			}
		}
		return h >= 20
	})

	// 100 endpoint-only changes, alternating routes: out, replace, in.
	free := slices.Clone(pool)
	for i := range 100 {
		route := []string{"chat", "vid"}[i%2]
		extra := current[route][len(stay[route]):]
		switch {
		case len(extra) < 2 || (i/2)%3 == 0 && len(free) > 0: // scale out
			current[route] = append(current[route], free[0])
			free = free[1:]
		case (i/2)%3 == 1 && len(free) > 0: // replace the oldest extra
			gone := extra[0]
			current[route] = append(slices.Delete(current[route], len(stay[route]), len(stay[route])+1), free[0])
			free = append(free[1:], gone)
		default: // scale in
			gone := extra[len(extra)-1]
			current[route] = current[route][:len(current[route])-1]
			free = append(free, gone)
		}
		start := time.Now()
		files = d.files(current)
		reloadtest.KubeletSwap(t, dir, files)
		want := tableVersion(t, files[peers.Key(route)])
		testbin.WaitFor(t, wait, fmt.Sprintf("change %d acknowledged", i), func() bool { return reloadtest.EngineVersion(ctl, route) == want })
		// From the acknowledgement on, every request reaches the new set.
		names := map[string]bool{}
		for _, b := range current[route] {
			names[b.name] = true
		}
		for range 4 {
			code, body := nginxtest.Get(t, n.URL(route)+"who")
			if code != 200 || !names[strings.TrimSpace(body)] {
				t.Fatalf("change %d (%s): after the acknowledgement a request got %d %q, not a peer of %v", i, route, code, body, slices.Sorted(func(yield func(string) bool) {
					for k := range names {
						if !yield(k) {
							return
						}
					}
				}))
			}
		}
		time.Sleep(max(0, 250*time.Millisecond-time.Since(start)))
	}
	if got := hups(n) - baseHUPs; got != 0 {
		t.Errorf("%d SIGHUPs for endpoint-only changes, want 0", got)
	}
	if got := n.WorkerPIDs(); !slices.Equal(got, workers) {
		t.Errorf("worker pids %v, were %v: nginx started a new generation", got, workers)
	}
	if c := shuttingDown(t, n); c != 0 {
		t.Errorf("%d workers shutting down, want 0", c)
	}
	streams.Wait()
	close(results)
	for r := range results {
		if r.err != nil || r.lines != streamLines {
			t.Errorf("stream on %s: %d of %d lines, err %v: cut", r.route, r.lines, streamLines, r.err)
		}
	}
	if s.count("result=success") != 0 {
		t.Errorf("the sidecar reloaded during endpoint-only changes:\n%s", s.log.String())
	}

	// A spec change still reloads, and the new file is served.
	d2 := newDynRoutes(t, n, "  failureMode: FailOpen\n")
	files = d2.files(current)
	reloadtest.KubeletSwap(t, dir, files)
	s.waitCount(t, 1, "result=success")
	testbin.WaitFor(t, wait, "the reloaded chat route to register FailOpen", func() bool {
		code, body := nginxtest.Get(t, n.URL("chat")+"_status")
		return code == 200 && strings.Contains(body, "FailOpen")
	})

	// A fresh nginx (not a HUP) serves the last table before any push:
	// stop the sidecar's pushes by stopping nginx, then start it again and
	// ask at once.
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := n.Relaunch(); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, b := range current["vid"] {
		names[b.name] = true
	}
	for range 6 {
		code, body := nginxtest.Get(t, n.URL("vid")+"who")
		if code != 200 || !names[strings.TrimSpace(body)] {
			t.Fatalf("after a restart: %d %q, want a peer of the last table", code, body)
		}
	}
	// The sidecar sees the new master and pushes every table to it.
	for _, r := range []string{"chat", "vid"} {
		want := tableVersion(t, files[peers.Key(r)])
		testbin.WaitFor(t, wait, "the push of "+r+" to the new master", func() bool {
			resp, err := ctl.Get("http://engine/peers/" + r)
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			var a struct {
				Version string `json:"version"`
				Serial  int64  `json:"serial"`
			}
			return json.NewDecoder(resp.Body).Decode(&a) == nil && a.Version == want && a.Serial > 0
		})
	}
}

// BenchmarkDynamicPeersMounted: mounted mode (kubelet-style volume, the
// real reload binary with --debounce 50ms) with dynamic peers: a changed
// peers table of the llm route (one of N peers replaced) until the engine
// holds its version (every worker picks from it from its next request).
// Peers are addresses nothing listens on: only the push is timed.
func BenchmarkDynamicPeersMounted(b *testing.B) {
	for _, peersN := range []int{10, 1000} {
		b.Run(fmt.Sprintf("peers=%d", peersN), func(b *testing.B) {
			dir := b.TempDir()
			n := nginxtest.Start(b, nginxtest.Options{Reference: true, RoutesDir: dir, Workers: 2})
			d := newDynRoutes(b, n, "")
			render := func(last int) map[string]string {
				var eps []endpoints.Endpoint
				for i := range peersN - 1 {
					eps = append(eps, endpoints.Endpoint{IP: fmt.Sprintf("10.3.%d.%d", i/250, 1+i%250), Port: 8000, Ready: true})
				}
				eps = append(eps, endpoints.Endpoint{IP: fmt.Sprintf("10.4.%d.%d", last/250, 1+last%250), Port: 8000, Ready: true})
				res, err := compiler.Compile(d.specs["chat"], compiler.Snapshot{Backends: endpoints.Normalize(eps)}, compiler.Options{SockDir: n.SockDir(), DynamicPeers: true})
				if err != nil {
					b.Fatal(err)
				}
				out := map[string]string{}
				for _, o := range res.Outputs {
					v, _ := o.Render(nil)
					out[o.Key] = string(v)
				}
				return out
			}
			files := render(0)
			reloadtest.KubeletSwap(b, dir, files)
			if err := n.Reload(); err != nil {
				b.Fatal(err)
			}
			ctl := control(n)
			startSidecar(b, "--watch", dir, "--process", n.MasterMatch(), "--sock-dir", n.SockDir(), "--check-cmd", checkCmd(n), "--debounce", "50ms", "--log-level=info")
			want := tableVersion(b, files[peers.Key("chat")])
			testbin.WaitFor(b, wait, "the start push", func() bool { return reloadtest.EngineVersion(ctl, "chat") == want })
			var ds []time.Duration
			b.ResetTimer()
			for i := range b.N {
				files = render(i + 1)
				want := tableVersion(b, files[peers.Key("chat")])
				t0 := time.Now()
				reloadtest.KubeletSwap(b, dir, files)
				deadline := t0.Add(wait)
				for reloadtest.EngineVersion(ctl, "chat") != want {
					if time.Now().After(deadline) {
						b.Fatalf("change %d never acknowledged", i)
					}
					time.Sleep(time.Millisecond)
				}
				ds = append(ds, time.Since(t0))
			}
			b.StopTimer()
			reportLatencies(b, ds)
		})
	}
}

// TestAppliedDynamicPeers: API mode end to end with dynamic peers (the
// controller on a real API server, the sidecar reading the ConfigMap, the
// shipped nginx.conf): a scale-out reaches openresty-0 as a push — its
// served report names the new peers table with how "push" and the route's
// Applied condition is True 1/1 again — while nginx is not reloaded and
// its route file is unchanged.
func TestAppliedDynamicPeers(t *testing.T) {
	e := startAppliedEnvWith(t, "100ms", true)
	ctx := context.Background()
	key := peers.Key("qwen")
	report := func() servedpkg.Report {
		var p corev1.Pod
		testbin.Must(t, e.k8s.Get(ctx, client.ObjectKey{Namespace: appliedNS, Name: "openresty-0"}, &p))
		r, _ := servedpkg.Parse(p.Annotations[servedpkg.Annotation])
		return r
	}
	cm := func() map[string]string {
		var c corev1.ConfigMap
		testbin.Must(t, e.k8s.Get(ctx, client.ObjectKey{Namespace: appliedNS, Name: "routes"}, &c))
		return c.Data
	}
	testbin.WaitFor(t, wait, "openresty-0 to serve the first table", func() bool {
		d := cm()
		return d[key] != "" && report().Keys[key] == servedpkg.ID([]byte(d[key]))
	})
	conf := cm()[appliedKey]
	if !strings.Contains(conf, "register_dynamic_route") {
		t.Fatalf("the route file is not dynamic:\n%s", conf)
	}
	reloads := e.s0.count("result=success")
	e.backends("10.1.0.1", "10.1.0.2", "10.1.0.3")
	testbin.WaitFor(t, wait, "openresty-0 to serve the scaled-out table", func() bool {
		d := cm()
		r := report()
		return strings.Contains(d[key], `"10.1.0.3"`) && r.Keys[key] == servedpkg.ID([]byte(d[key])) && r.How == servedpkg.HowPush
	})
	tab, err := peers.Parse([]byte(cm()[key]))
	if err != nil {
		t.Fatal(err)
	}
	if got := report().Peers["qwen"]; got != tab.Version {
		t.Fatalf("the report names version %q, the table is %q", got, tab.Version)
	}
	if cm()[appliedKey] != conf {
		t.Fatal("the route file changed with the endpoints")
	}
	if n := e.s0.count("result=success"); n != reloads {
		t.Fatalf("%d reloads for a scale-out, want none", n-reloads)
	}
	testbin.WaitFor(t, wait, "Applied True 1/1", func() bool {
		var rt v1alpha1.ModelRoute
		testbin.Must(t, e.k8s.Get(ctx, client.ObjectKey{Namespace: appliedNS, Name: "qwen"}, &rt))
		c := meta.FindStatusCondition(rt.Status.Conditions, controller.TypeApplied)
		return c != nil && c.Status == metav1.ConditionTrue && rt.Status.Synced == "1/1"
	})
}
