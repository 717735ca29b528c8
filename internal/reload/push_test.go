package reload

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/internal/reload/reloadtest"
	"github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// fakeEngine answers the control protocol on <dir>/autoconfig@control.sock
// the way the reference engine does (docs/lua-contract.md): a narrow
// stand-in for these unit tests; cmd/reload's tests push into real nginx.
type fakeEngine struct {
	mu     sync.Mutex
	tables map[string]peers.Table
	pushes []string // route@version, in order
	refuse map[string]int
	serial int64 // highest serial stored (one for all routes here)
	// notFound answers the next pushes of a route 404 (a worker of the
	// old generation, which does not know the route yet).
	notFound map[string]int
	// missing are routes the engine does not have: every push 404.
	missing map[string]bool
}

func startFakeEngine(t *testing.T, sockDir string) *fakeEngine {
	t.Helper()
	e := &fakeEngine{tables: map[string]peers.Table{}, refuse: map[string]int{}, notFound: map[string]int{}, missing: map[string]bool{}}
	l, err := net.Listen("unix", filepath.Join(sockDir, peers.ControlSocket))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(e.serve)}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return e
}

func (e *fakeEngine) serve(w http.ResponseWriter, req *http.Request) {
	route, ok := strings.CutPrefix(req.URL.Path, "/peers/")
	if !ok || req.Method != http.MethodPut {
		http.Error(w, "no", http.StatusNotFound)
		return
	}
	b, _ := io.ReadAll(req.Body)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.missing[route] || e.notFound[route] > 0 {
		e.notFound[route]--
		http.Error(w, "no such route", http.StatusNotFound)
		return
	}
	if code := e.refuse[route]; code != 0 {
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(map[string]string{"error": "refused by the test"})
		return
	}
	tab, err := peers.Parse(b)
	serial, serr := strconv.ParseInt(req.Header.Get(peers.SerialHeader), 10, 64)
	if err != nil || tab.Route != route || serr != nil || serial > 1<<53 {
		http.Error(w, "bad table", http.StatusBadRequest)
		return
	}
	if serial < e.serial {
		w.WriteHeader(http.StatusConflict)
		json.NewEncoder(w).Encode(map[string]any{"error": "older serial", "serial": e.serial})
		return
	}
	e.serial = serial
	e.tables[route] = tab
	e.pushes = append(e.pushes, route+"@"+tab.Version)
	json.NewEncoder(w).Encode(map[string]any{"route": route, "version": tab.Version, "peers": tab.Peers()})
}

func (e *fakeEngine) setRefuse(route string, code int) {
	e.mu.Lock()
	e.refuse[route] = code
	e.mu.Unlock()
}

func (e *fakeEngine) version(route string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tables[route].Version
}

func (e *fakeEngine) pushCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.pushes)
}

func dynFiles(t *testing.T, conf string, ips ...string) (map[string]string, string) {
	pt, v := reloadtest.PeersTable(t, "r", ips...)
	return map[string]string{"session_route_r.conf": conf, peers.Key("r"): pt}, v
}

// TestPeersOnlyChangeIsPushed: with the engine on its control socket, a
// change of only the peers table is pushed (no signal) and reported as
// served "push" with the acknowledged version; a route file change still
// signals, and every table is pushed after it.
func TestPeersOnlyChangeIsPushed(t *testing.T) {
	dir, sock := t.TempDir(), t.TempDir()
	f0, _ := dynFiles(t, "conf 1\n", "10.0.0.1")
	reloadtest.KubeletSwap(t, dir, f0)
	eng := startFakeEngine(t, sock)
	name := uniqueName("nginx-like")
	target := reloadtest.StartHUPCounter(t, name)
	var rep testbin.Recorder[served.Report]
	pushed := make(chan []string, 10)
	startReloader(t, Options{WatchDirs: []string{dir}, Process: name, SockDir: sock, SockSweep: 50 * time.Millisecond, Debounce: 20 * time.Millisecond},
		reportTo(rep.Add), func(r *Reloader) { r.push.onPush = func(keys, _ []string) { pushed <- keys } })
	// At start the tables are pushed once the engine listens.
	_, v0 := reloadtest.PeersTable(t, "r", "10.0.0.1")
	testbin.WaitFor(t, wait, "the start push", func() bool { return eng.version("r") == v0 })

	for i, ips := range [][]string{{"10.0.0.1", "10.0.0.2"}, {"10.0.0.2"}, {"10.0.0.3", "10.0.0.4"}} {
		f, v := dynFiles(t, "conf 1\n", ips...)
		reloadtest.KubeletSwap(t, dir, f)
		select {
		case keys := <-pushed:
			if len(keys) != 1 || keys[0] != peers.Key("r") {
				t.Fatalf("change %d: pushed %v", i, keys)
			}
		case <-time.After(wait):
			t.Fatalf("change %d: nothing pushed", i)
		}
		if got := eng.version("r"); got != v {
			t.Fatalf("change %d: engine holds %q, want %q", i, got, v)
		}
		last := rep.Get()[len(rep.Get())-1]
		if last.How != served.HowPush || last.Keys[peers.Key("r")] != served.ID([]byte(f[peers.Key("r")])) || last.Peers["r"] != v {
			t.Fatalf("change %d: report %+v", i, last)
		}
	}
	if n := target.Count(); n != 0 {
		t.Fatalf("%d signals for peers-only changes, want 0", n)
	}

	// A route file change signals, then the table is pushed.
	f, v := dynFiles(t, "conf 2\n", "10.0.0.9")
	before := eng.pushCount()
	reloadtest.KubeletSwap(t, dir, f)
	testbin.WaitFor(t, wait, "the signal", func() bool { return target.Count() == 1 })
	testbin.WaitFor(t, wait, "the push after the signal", func() bool { return eng.version("r") == v && eng.pushCount() > before })
	testbin.WaitFor(t, wait, "the report", func() bool {
		last := rep.Get()[len(rep.Get())-1]
		return last.How == served.HowSignal && last.Keys[peers.Key("r")] == served.ID([]byte(f[peers.Key("r")]))
	})
}

// TestRefusedPushKeepsTheLastGoodTable: a table the engine refuses is not
// reported as served (no report names it, so Applied says Stale), nothing
// is signalled, and the push is retried at the resync until the engine
// takes it.
func TestRefusedPushKeepsTheLastGoodTable(t *testing.T) {
	dir, sock := t.TempDir(), t.TempDir()
	f0, v0 := dynFiles(t, "conf\n", "10.0.0.1")
	reloadtest.KubeletSwap(t, dir, f0)
	eng := startFakeEngine(t, sock)
	name := uniqueName("nginx-like")
	target := reloadtest.StartHUPCounter(t, name)
	var rep testbin.Recorder[served.Report]
	refusals := make(chan []string, 100)
	startReloader(t, Options{WatchDirs: []string{dir}, Process: name, SockDir: sock, SockSweep: 50 * time.Millisecond, Debounce: 20 * time.Millisecond, Resync: 300 * time.Millisecond},
		reportTo(rep.Add), func(r *Reloader) {
			r.push.onPush = func(_, refused []string) {
				select {
				case refusals <- refused:
				default:
				}
			}
		})
	testbin.WaitFor(t, wait, "the start push", func() bool { return eng.version("r") == v0 })

	eng.setRefuse("r", http.StatusInsufficientStorage)
	f1, v1 := dynFiles(t, "conf\n", "10.0.0.1", "10.0.0.2")
	reloadtest.KubeletSwap(t, dir, f1)
	// Two refusals: the change's push and the resync's.
	for i := 0; i < 2; {
		select {
		case refused := <-refusals:
			if len(refused) == 1 && refused[0] == peers.Key("r") {
				i++
			}
		case <-time.After(wait):
			t.Fatal("no refused push")
		}
	}
	for _, r := range rep.Get() {
		if r.Keys[peers.Key("r")] == served.ID([]byte(f1[peers.Key("r")])) || r.Peers["r"] == v1 {
			t.Fatalf("a report names the refused table: %+v", r)
		}
	}
	if eng.version("r") != v0 {
		t.Fatal("the engine's table changed on a refusal")
	}
	eng.setRefuse("r", 0)
	testbin.WaitFor(t, wait, "the retried push", func() bool {
		last := rep.Get()[len(rep.Get())-1]
		return eng.version("r") == v1 && last.Peers["r"] == v1 && last.Keys[peers.Key("r")] == served.ID([]byte(f1[peers.Key("r")]))
	})
	if n := target.Count(); n != 0 {
		t.Fatalf("%d signals, want 0: a refused table is no reason to reload", n)
	}
}

// TestNoControlSocketReloads: without the engine's control socket (an
// engine that does not take peers), a peers table change reloads as any
// change does.
func TestNoControlSocketReloads(t *testing.T) {
	dir, sock := t.TempDir(), t.TempDir()
	f0, _ := dynFiles(t, "conf\n", "10.0.0.1")
	reloadtest.KubeletSwap(t, dir, f0)
	name := uniqueName("nginx-like")
	target := reloadtest.StartHUPCounter(t, name)
	startReloader(t, Options{WatchDirs: []string{dir}, Process: name, SockDir: sock, Debounce: 20 * time.Millisecond})
	f1, _ := dynFiles(t, "conf\n", "10.0.0.2")
	reloadtest.KubeletSwap(t, dir, f1)
	testbin.WaitFor(t, wait, "the signal", func() bool { return target.Count() == 1 })
}

// TestPushAboveANewerSerial: an engine holding a serial above this
// sidecar's clock (the previous sidecar of the pod pushed many tables in
// one millisecond) refuses the push with 409 naming its serial; the
// sidecar pushes again above it, and the table is taken.
func TestPushAboveANewerSerial(t *testing.T) {
	dir, sock := t.TempDir(), t.TempDir()
	f0, v0 := dynFiles(t, "conf\n", "10.0.0.1")
	reloadtest.KubeletSwap(t, dir, f0)
	eng := startFakeEngine(t, sock)
	eng.mu.Lock()
	eng.serial = time.Now().Add(time.Hour).UnixMilli()
	eng.mu.Unlock()
	name := uniqueName("nginx-like")
	reloadtest.StartHUPCounter(t, name)
	startReloader(t, Options{WatchDirs: []string{dir}, Process: name, SockDir: sock, SockSweep: 50 * time.Millisecond, Debounce: 20 * time.Millisecond})
	testbin.WaitFor(t, wait, "the start push above the engine's serial", func() bool { return eng.version("r") == v0 })
}

// TestPushAfterReloadAsksAgain: right after a reload the engine may answer
// a push 404 for a route the reload added (an old worker took the
// connection); the sidecar asks again instead of reloading a second time.
func TestPushAfterReloadAsksAgain(t *testing.T) {
	dir, sock := t.TempDir(), t.TempDir()
	f0, v0 := dynFiles(t, "conf 1\n", "10.0.0.1")
	reloadtest.KubeletSwap(t, dir, f0)
	eng := startFakeEngine(t, sock)
	name := uniqueName("nginx-like")
	target := reloadtest.StartHUPCounter(t, name)
	startReloader(t, Options{WatchDirs: []string{dir}, Process: name, SockDir: sock, SockSweep: 50 * time.Millisecond, Debounce: 20 * time.Millisecond})
	testbin.WaitFor(t, wait, "the start push", func() bool { return eng.version("r") == v0 })

	eng.mu.Lock()
	eng.notFound["r"] = 3
	eng.mu.Unlock()
	f1, v1 := dynFiles(t, "conf 2\n", "10.0.0.2")
	reloadtest.KubeletSwap(t, dir, f1)
	testbin.WaitFor(t, wait, "the push after the reload", func() bool { return eng.version("r") == v1 })
	// A later peers-only change is pushed, and nothing reloads again.
	f2, v2 := dynFiles(t, "conf 2\n", "10.0.0.3")
	reloadtest.KubeletSwap(t, dir, f2)
	testbin.WaitFor(t, wait, "the next push", func() bool { return eng.version("r") == v2 })
	if n := target.Count(); n != 1 {
		t.Fatalf("%d signals, want 1 (the route file change)", n)
	}
}

// TestTableWithoutRouteAtStart: a table of a route the engine lacks, on
// disk when the sidecar starts, costs one reload at most (the engine may
// run older route files than the disk shows); after it the table waits
// for its route, pushed again with backoff, and nothing signals again over
// many resyncs. The other table is pushed and reported.
func TestTableWithoutRouteAtStart(t *testing.T) {
	dir, sock := t.TempDir(), t.TempDir()
	f, v := dynFiles(t, "conf\n", "10.0.0.1")
	ghost, _ := reloadtest.PeersTable(t, "ghost", "10.0.0.7")
	f[peers.Key("ghost")] = ghost
	reloadtest.KubeletSwap(t, dir, f)
	eng := startFakeEngine(t, sock)
	eng.mu.Lock()
	eng.missing["ghost"] = true
	eng.mu.Unlock()
	name := uniqueName("nginx-like")
	target := reloadtest.StartHUPCounter(t, name)
	var rep testbin.Recorder[served.Report]
	h := startReloader(t, Options{WatchDirs: []string{dir}, Process: name, SockDir: sock, SockSweep: 50 * time.Millisecond, Debounce: 20 * time.Millisecond, Resync: 100 * time.Millisecond},
		reportTo(rep.Add))
	testbin.WaitFor(t, wait, "the start push of r", func() bool { return eng.version("r") == v })
	m := h.r.metrics
	// 404s: the start push, the resync's push, the one after the reload,
	// then the backoff's at resync ticks 1, 2, 4 and 8 after it.
	testbin.WaitFor(t, wait, "seven no_route pushes", func() bool {
		if n := target.Count(); n > 1 {
			t.Fatalf("%d signals for a table without its route, want at most 1", n)
		}
		return testutil.ToFloat64(m.Pushes.WithLabelValues(PushNoRoute)) >= 7
	})
	if n := target.Count(); n > 1 {
		t.Fatalf("%d signals, want at most 1", n)
	}
	if g := testutil.ToFloat64(m.PeersUnserved.WithLabelValues(PushNoRoute)); g != 1 {
		t.Errorf("peers_tables_unserved{reason=no_route} = %v, want 1", g)
	}
	for _, r := range rep.Get()[1:] { // the first is the start's: what the target is taken to serve
		if _, ok := r.Keys[peers.Key("ghost")]; ok || r.Peers["ghost"] != "" {
			t.Errorf("a report (how %s) names the table without its route: %+v", r.How, r)
		}
	}
}
