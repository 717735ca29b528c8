package reload_test

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/internal/reload"
	"github.com/modelsphere/autoconfig/internal/reload/reloadtest"
	"github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// nginxWait bounds every wait of these tests; nothing is a timing
// assertion.
const nginxWait = 60 * time.Second

// countLines is how many lines of log contain every one of subs.
func countLines(log *testbin.SyncBuffer, subs ...string) int {
	n := 0
	sc := bufio.NewScanner(strings.NewReader(log.String()))
	sc.Buffer(nil, 1<<20)
lines:
	for sc.Scan() {
		for _, s := range subs {
			if !strings.Contains(sc.Text(), s) {
				continue lines
			}
		}
		n++
	}
	return n
}

// metric is the value of the series name{label="value"} in reg (0 when
// it does not exist).
func metric(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// routeFile is a route file as far as the engine's control endpoint is
// concerned: the route's shared dict, which holds its table, named as the
// route.
func routeFile(route string) string {
	return "# route " + route + ": its peers table lives in its dict\nlua_shared_dict " + route + " 1m;\n"
}

// startEngine runs a real nginx (2 workers) including the route files of
// dir, with the reference engine's control endpoint as the shipped
// nginx.conf serves it: router_control's handler on
// <sock>/autoconfig@control.sock, which takes a table for a route whose
// file declares its dict and answers 404 for any other. sock is the
// sidecar's --sock-dir.
func startEngine(t *testing.T, dir string) (n *nginxtest.Nginx, sock string) {
	t.Helper()
	// Not t.TempDir(): a unix socket path has at most 108 bytes.
	sock, err := os.MkdirTemp("", "ctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	n = nginxtest.Start(t, nginxtest.Options{RoutesDir: dir, Workers: 2, LuaPackagePath: nginxtest.RouterLuaPath(), HTTPConfig: `
    server {
        listen unix:` + filepath.Join(sock, peers.ControlSocket) + `;
        client_max_body_size 64m;
        client_body_buffer_size 64m;
        location / {
            content_by_lua_block {
                require("router_control").handle()
            }
        }
    }
`})
	return n, sock
}

// TestNginxTableWithoutItsRouteReloadsOnce: on a real nginx and the
// reference engine's control endpoint, a peers table whose route field is not its
// key's route is refused before any push (it replaces no route's table,
// is logged and counted once, and no report names it), and a table of a
// route the engine lacks (peers_ghost.json without its route file) costs
// at most one reload: over many resyncs after it nginx receives no other
// SIGHUP, the table waits for its route (logged once, pushed again with
// backoff, counted as no_route, peers_tables_unserved says so), and the
// route file arriving later makes its push succeed.
func TestNginxTableWithoutItsRouteReloadsOnce(t *testing.T) {
	dir := t.TempDir()
	tabR, vR := reloadtest.PeersTable(t, "r", "10.0.0.1")
	files := map[string]string{"session_route_r.conf": routeFile("r"), peers.Key("r"): tabR}
	reloadtest.KubeletSwap(t, dir, files)
	n, sock := startEngine(t, dir)
	hups := func() int { return strings.Count(n.ErrorLog(), "signal 1 (SIGHUP) received") }
	ctl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", filepath.Join(sock, peers.ControlSocket))
	}}}

	var logs testbin.SyncBuffer
	reg := prometheus.NewRegistry()
	r, err := reload.New(reload.Options{
		WatchDirs: []string{dir}, Process: n.MasterMatch(), SockDir: sock, CheckCmd: strings.Join(n.TestCommand(), " "),
		Debounce: 20 * time.Millisecond, Resync: 250 * time.Millisecond, SockSweep: 50 * time.Millisecond,
	}, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), reg)
	if err != nil {
		t.Fatal(err)
	}
	var rep testbin.Recorder[served.Report]
	reload.SetReportForTest(r, rep.Add)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("reload log:\n%s", logs.String())
		}
	})
	testbin.Run(t, "reloader", r.Run, r.Started())
	testbin.WaitFor(t, nginxWait, "the start push of r", func() bool { return reloadtest.EngineVersion(ctl, "r") == vR })
	pushes := func(result string) float64 {
		return metric(t, reg, "autoconfig_reload_peers_pushes_total", "result", result)
	}
	unserved := func(reason string) float64 {
		return metric(t, reg, "autoconfig_reload_peers_tables_unserved", "reason", reason)
	}
	reloads := func() float64 { return metric(t, reg, "autoconfig_reload_reloads_total", "result", "success") }
	notNamed := func(keys ...string) {
		t.Helper()
		for _, rp := range rep.Get() {
			for _, k := range keys {
				if _, ok := rp.Keys[k]; ok {
					t.Errorf("a served report (how %s) names %s, which the engine does not hold: %+v", rp.How, k, rp)
				}
			}
		}
	}

	// A table under peers_mm.json whose route field says r: refused before
	// any push. Pushed, it would have replaced r's table.
	tabMM, vMM := reloadtest.PeersTable(t, "r", "10.0.0.9")
	files[peers.Key("mm")] = tabMM
	reloadtest.KubeletSwap(t, dir, files)
	testbin.WaitFor(t, nginxWait, "the refusal of peers_mm.json", func() bool {
		if v := reloadtest.EngineVersion(ctl, "r"); v == vMM {
			t.Fatalf("the engine holds peers_mm.json's table as r's (%s): a table was pushed to the route its route field names, not its key's", v)
		}
		return pushes(reload.PushInvalid) == 1
	})
	base := countLines(&logs, "no peers table taken")
	testbin.WaitFor(t, nginxWait, "three resyncs with peers_mm.json refused", func() bool {
		return countLines(&logs, "no peers table taken") >= base+3
	})
	if got := pushes(reload.PushInvalid); got != 1 {
		t.Errorf("peers_pushes_total{result=invalid} = %v after several resyncs, want 1 (one refused content)", got)
	}
	if got := unserved(reload.PushInvalid); got != 1 {
		t.Errorf("peers_tables_unserved{reason=invalid} = %v, want 1", got)
	}
	if c := countLines(&logs, "level=ERROR", "refused before pushing", "key="+peers.Key("mm")); c != 1 {
		t.Errorf("the refusal of peers_mm.json is logged %d times, want once", c)
	}
	if v := reloadtest.EngineVersion(ctl, "r"); v != vR {
		t.Errorf("the engine holds %q for r, want r's own table %s", v, vR)
	}
	if h := hups(); h != 0 {
		t.Errorf("%d SIGHUPs for a refused table, want 0", h)
	}

	// peers_ghost.json: a route the engine lacks. One reload at most, then
	// the table waits for its route.
	tabG, vG := reloadtest.PeersTable(t, "ghost", "10.0.0.7")
	files[peers.Key("ghost")] = tabG
	reloadtest.KubeletSwap(t, dir, files)
	// no_route pushes: the change's, the one after the reload, then one at
	// resync ticks 1, 2 and 4 after it: 7 resyncs or more.
	testbin.WaitFor(t, nginxWait, "five no_route pushes of peers_ghost.json", func() bool {
		if h := hups(); h > 1 {
			t.Fatalf("%d SIGHUPs for peers_ghost.json, want at most 1:\n%s", h, n.ErrorLog())
		}
		return pushes(reload.PushNoRoute) >= 5
	})
	if h, s := hups(), reloads(); h > 1 || s > 1 {
		t.Errorf("%d SIGHUPs, reloads_total{success} %v, want at most 1 each", h, s)
	}
	if got := unserved(reload.PushNoRoute); got != 1 {
		t.Errorf("peers_tables_unserved{reason=no_route} = %v, want 1", got)
	}
	if c := countLines(&logs, "level=ERROR", "waits for its route", "key="+peers.Key("ghost")); c != 1 {
		t.Errorf("peers_ghost.json's wait is logged %d times, want once", c)
	}
	if v := reloadtest.EngineVersion(ctl, "ghost"); v != "" {
		t.Errorf("the engine holds %q for ghost, a route it does not have", v)
	}
	notNamed(peers.Key("mm"), peers.Key("ghost"))

	// Its route file arrives: the reload it brings makes the push succeed.
	before, taken := hups(), pushes(reload.PushAccepted)
	files["session_route_ghost.conf"] = routeFile("ghost")
	reloadtest.KubeletSwap(t, dir, files)
	testbin.WaitFor(t, nginxWait, "the engine to hold ghost's table", func() bool { return reloadtest.EngineVersion(ctl, "ghost") == vG })
	testbin.WaitFor(t, nginxWait, "the report naming ghost's table", func() bool {
		l := rep.Get()
		last := l[len(l)-1]
		return last.Keys[peers.Key("ghost")] == served.ID([]byte(tabG)) && last.Peers["ghost"] == vG
	})
	if got := unserved(reload.PushNoRoute); got != 0 {
		t.Errorf("peers_tables_unserved{reason=no_route} = %v once ghost's table is taken, want 0", got)
	}
	if got := unserved(reload.PushInvalid); got != 1 {
		t.Errorf("peers_tables_unserved{reason=invalid} = %v, want 1 (peers_mm.json is still refused)", got)
	}
	if got := pushes(reload.PushAccepted); got <= taken {
		t.Errorf("peers_pushes_total{result=accepted} = %v, was %v: ghost's push is not counted", got, taken)
	}
	if h := hups(); h != before+1 {
		t.Errorf("%d SIGHUPs for the route file of ghost, want 1", h-before)
	}
	if c := countLines(&logs, "level=INFO", "peers table taken", "key="+peers.Key("ghost")); c != 1 {
		t.Errorf("ghost's table being taken is logged %d times, want once", c)
	}
	if v := reloadtest.EngineVersion(ctl, "r"); v != vR {
		t.Errorf("the engine holds %q for r, want %s", v, vR)
	}
	notNamed(peers.Key("mm"))
}
