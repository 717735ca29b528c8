package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/reload/reloadtest"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// routeConf is a minimal route file of the shape the compiler renders: a
// server listening only on the route's socket.
func routeConf(n *nginxtest.Nginx, route, body string) string {
	return fmt.Sprintf("server {\n    listen unix:%s;\n    location / { return 200 \"%s\\n\"; }\n}\n", n.SockPath(route), body)
}

func routeFile(route string) string { return "session_route_" + route + ".conf" }

// startNginx runs nginx on a kubelet-style routes directory holding files.
func startNginx(t *testing.T, files func(n *nginxtest.Nginx) map[string]string) (*nginxtest.Nginx, string) {
	t.Helper()
	dir := t.TempDir()
	n := nginxtest.Start(t, nginxtest.Options{RoutesDir: dir})
	reloadtest.KubeletSwap(t, dir, files(n))
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	return n, dir
}

func wantServes(t testing.TB, n *nginxtest.Nginx, route, body string) {
	t.Helper()
	if code, got := nginxtest.Get(t, n.URL(route)); code != 200 || got != body+"\n" {
		t.Fatalf("route %s: got %d %q, want 200 %q", route, code, got, body)
	}
}

// waitServes waits until route answers body: after a reload an old
// worker may still accept for a moment.
func waitServes(t testing.TB, n *nginxtest.Nginx, route, body string) {
	t.Helper()
	var code int
	var got string
	testbin.WaitFor(t, wait, "route "+route+" to serve "+body, func() bool {
		code, got = nginxtest.Get(t, n.URL(route))
		return code == 200 && got == body+"\n"
	})
}

// hups counts the SIGHUPs nginx received, from its error log.
func hups(n *nginxtest.Nginx) int { return strings.Count(n.ErrorLog(), "(SIGHUP) received") }

func checkCmd(n *nginxtest.Nginx) string { return strings.Join(n.TestCommand(), " ") }

func TestNginxKubeletSwaps(t *testing.T) {
	n, dir := startNginx(t, func(n *nginxtest.Nginx) map[string]string {
		return map[string]string{routeFile("a"): routeConf(n, "a", "a1")}
	})
	base := hups(n)
	// A live socket nobody references (another writer's): never removed.
	foreign, err := net.Listen("unix", filepath.Join(n.SockDir(), "foreign.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()

	s := startSidecar(t, "--watch", dir, "--process", n.MasterMatch(), "--sock-dir", n.SockDir(), "--check-cmd", checkCmd(n))

	reloadtest.KubeletSwap(t, dir, map[string]string{
		routeFile("a"): routeConf(n, "a", "a2"),
		routeFile("b"): routeConf(n, "b", "b1"),
	})
	s.waitCount(t, 1, "result=success")
	waitServes(t, n, "a", "a2")
	waitServes(t, n, "b", "b1")
	if h := hups(n) - base; h != 1 {
		t.Fatalf("nginx got %d SIGHUPs for one swap, want 1", h)
	}

	// Route b removed, c added: b's socket is live until the reload, so the
	// sidecar keeps it; nginx unlinks it itself on the graceful reload.
	reloadtest.KubeletSwap(t, dir, map[string]string{
		routeFile("a"): routeConf(n, "a", "a2"),
		routeFile("c"): routeConf(n, "c", "c1"),
	})
	s.waitCount(t, 2, "result=success")
	waitServes(t, n, "c", "c1")
	wantServes(t, n, "a", "a2")
	testbin.WaitFor(t, wait, "removed route b to answer 502", func() bool {
		code, _ := nginxtest.Get(t, n.URL("b"))
		return code == http.StatusBadGateway
	})
	if h := hups(n) - base; h != 2 {
		t.Fatalf("nginx got %d SIGHUPs for two swaps, want 2", h)
	}
	if s.count("removed stale socket") != 0 {
		t.Fatalf("the sidecar removed a socket although every socket was live:\n%s", s.log.String())
	}
	if !strings.Contains(n.ErrorLog(), "deleting socket "+n.SockPath("b")) {
		t.Fatalf("nginx did not delete b's socket itself:\n%s", n.ErrorLog())
	}
	if c, err := net.Dial("unix", filepath.Join(n.SockDir(), "foreign.sock")); err != nil {
		t.Fatalf("the foreign live socket was removed: %v", err)
	} else {
		c.Close()
	}
	if v := s.metric(t, `autoconfig_reload_reloads_total{result="success"}`); v != 2 {
		t.Fatalf("success count %v, want 2", v)
	}
}

func TestNginxBurstGivesOneOrTwoReloads(t *testing.T) {
	n, dir := startNginx(t, func(n *nginxtest.Nginx) map[string]string {
		return map[string]string{routeFile("a"): routeConf(n, "a", "v0")}
	})
	base := hups(n)
	s := startSidecar(t, "--watch", dir, "--process", n.MasterMatch(), "--sock-dir", n.SockDir(), "--check-cmd", checkCmd(n))

	// 20 swaps in about 100 ms.
	for i := 1; i <= 20; i++ {
		reloadtest.KubeletSwap(t, dir, map[string]string{routeFile("a"): routeConf(n, "a", fmt.Sprintf("v%d", i))})
		time.Sleep(5 * time.Millisecond)
	}
	testbin.WaitFor(t, wait, "nginx to serve v20", func() bool {
		_, body := nginxtest.Get(t, n.URL("a"))
		return body == "v20\n"
	})
	s.waitCount(t, 1, "result=success")
	h := hups(n) - base
	if h < 1 || h > 2 {
		t.Fatalf("20 swaps gave %d SIGHUPs, want 1 or 2", h)
	}
	if r := s.count("result="); r != h {
		t.Fatalf("%d reload attempts logged for %d SIGHUPs", r, h)
	}
	t.Logf("20 swaps in 100 ms → %d reload(s)", h)
}

func brokenRoute(n *nginxtest.Nginx, route string) string {
	return fmt.Sprintf("server {\n    listen unix:%s;\n    no_such_directive on;\n}\n", n.SockPath(route))
}

func TestNginxBrokenConfigWithCheck(t *testing.T) {
	n, dir := startNginx(t, func(n *nginxtest.Nginx) map[string]string {
		return map[string]string{routeFile("a"): routeConf(n, "a", "good")}
	})
	base := hups(n)
	workers := n.WorkerPIDs()
	s := startSidecar(t, "--watch", dir, "--process", n.MasterMatch(), "--sock-dir", n.SockDir(), "--check-cmd", checkCmd(n))

	reloadtest.KubeletSwap(t, dir, map[string]string{
		routeFile("a"): routeConf(n, "a", "good"),
		routeFile("b"): brokenRoute(n, "b"),
	})
	// The volume is read-only: nothing is quarantined, but the log names
	// the key to fix.
	s.waitCount(t, 1, "result=check_failed", "no_such_directive", "keys=["+routeFile("b")+"]")
	if h := hups(n) - base; h != 0 {
		t.Fatalf("nginx got %d SIGHUPs despite a failing check", h)
	}
	wantServes(t, n, "a", "good")
	for _, w := range n.WorkerPIDs() {
		if !slices.Contains(workers, w) {
			t.Fatalf("a new worker %d started (before: %v): nginx was reloaded", w, workers)
		}
	}
	if v := s.metric(t, `autoconfig_reload_reloads_total{result="check_failed"}`); v != 1 {
		t.Fatalf("check_failed count %v, want 1", v)
	}

	// Fixed: the next change reloads.
	reloadtest.KubeletSwap(t, dir, map[string]string{
		routeFile("a"): routeConf(n, "a", "good"),
		routeFile("b"): routeConf(n, "b", "fixed"),
	})
	s.waitCount(t, 1, "result=success")
	waitServes(t, n, "b", "fixed")
}

func TestNginxBrokenConfigWithoutCheckIsReportedFailed(t *testing.T) {
	n, dir := startNginx(t, func(n *nginxtest.Nginx) map[string]string {
		return map[string]string{routeFile("a"): routeConf(n, "a", "good")}
	})
	base := hups(n)
	s := startSidecar(t, "--watch", dir, "--process", n.MasterMatch(), "--verify-timeout", "2s")

	reloadtest.KubeletSwap(t, dir, map[string]string{
		routeFile("a"): routeConf(n, "a", "good"),
		routeFile("b"): brokenRoute(n, "b"),
	})
	s.waitCount(t, 1, "result=failed", "reload failed")
	if h := hups(n) - base; h != 1 {
		t.Fatalf("nginx got %d SIGHUPs, want 1", h)
	}
	if !strings.Contains(n.ErrorLog(), `unknown directive "no_such_directive"`) {
		t.Fatalf("nginx did not reject the config:\n%s", n.ErrorLog())
	}
	wantServes(t, n, "a", "good")
	if v := s.metric(t, `autoconfig_reload_reloads_total{result="failed"}`); v != 1 {
		t.Fatalf("failed count %v, want 1", v)
	}
	if v := s.metric(t, `autoconfig_reload_last_reload_success_timestamp_seconds`); v != 0 {
		t.Fatalf("a failed reload set the success timestamp (%v)", v)
	}
}

func TestNginxStaleSocketAfterKill9(t *testing.T) {
	n, dir := startNginx(t, func(n *nginxtest.Nginx) map[string]string {
		return map[string]string{routeFile("a"): routeConf(n, "a", "a1")}
	})
	s := startSidecar(t, "--watch", dir, "--process", n.MasterMatch(), "--sock-dir", n.SockDir(), "--check-cmd", checkCmd(n))

	if err := n.Kill9(); err != nil {
		t.Fatal(err)
	}
	// The container restarts nginx at once. Without the sidecar this fails
	// (bind: Address already in use; see the nginxtest self-test); the
	// sidecar sees the master gone or replaced and removes the stale socket
	// within nginx's bind retries.
	if err := n.Relaunch(); err != nil {
		t.Fatalf("restarted nginx did not come up: %v", err)
	}
	wantServes(t, n, "a", "a1")
	s.waitCount(t, 1, "removed stale socket", "a.sock")

	// The restarted master is the new target: the next change reloads it,
	// and its live socket is left alone.
	reloadtest.KubeletSwap(t, dir, map[string]string{
		routeFile("a"): routeConf(n, "a", "a2"),
	})
	s.waitCount(t, 1, "result=success")
	waitServes(t, n, "a", "a2")
	if _, err := os.Stat(n.SockPath("a")); err != nil {
		t.Fatalf("the live socket is gone: %v", err)
	}
	if v := s.metric(t, `autoconfig_reload_stale_sockets_removed_total`); v != 1 {
		t.Fatalf("stale sockets removed %v, want 1", v)
	}
}

// TestNginxFloodDoesNotPostponeReloads: another route's file rewritten
// every 100 ms for 6 s (a steady writer) used to postpone every reload
// until the writes stopped, because the debounce waited for quiet without
// a bound. With --max-delay 1s, a change made during the flood is served
// while the flood still runs, and the flood costs about one reload per
// max-delay.
func TestNginxFloodDoesNotPostponeReloads(t *testing.T) {
	n, dir := startNginx(t, func(n *nginxtest.Nginx) map[string]string {
		return map[string]string{routeFile("a"): routeConf(n, "a", "a0"), routeFile("b"): routeConf(n, "b", "b1")}
	})
	base := hups(n)
	// With the check: a check that loses the race with the flood (the
	// content moved under it) must not start a new max-delay wait.
	startSidecar(t, "--watch", dir, "--process", n.MasterMatch(), "--sock-dir", n.SockDir(), "--check-cmd", checkCmd(n), "--debounce", "250ms", "--max-delay", "1s")
	const flood = 6 * time.Second
	done := make(chan struct{})
	start := time.Now()
	b := "b1"
	var bChanged time.Time
	go func() {
		defer close(done)
		for i := 1; time.Since(start) < flood; i++ {
			if b == "b1" && time.Since(start) > time.Second {
				b, bChanged = "b2", time.Now()
			}
			reloadtest.KubeletSwap(t, dir, map[string]string{routeFile("a"): routeConf(n, "a", fmt.Sprintf("a%d", i)), routeFile("b"): routeConf(n, "b", b)})
			time.Sleep(100 * time.Millisecond)
		}
	}()
	var served time.Time
	testbin.WaitFor(t, wait, "route b to serve b2", func() bool {
		_, got := nginxtest.Get(t, n.URL("b"))
		if got == "b2\n" {
			served = time.Now()
			return true
		}
		return false
	})
	floodRunning := time.Since(start) < flood
	<-done
	h := hups(n) - base
	t.Logf("flood of %s with a write every 100 ms: b2 served %s after its write (max-delay 1s); %d reloads during the flood", flood, served.Sub(bChanged).Round(time.Millisecond), h)
	if !floodRunning {
		t.Errorf("b2 was served only after the flood ended (%s after its write): the flood postponed the reload", served.Sub(bChanged))
	}
	if limit := int(flood/time.Second) + 2; h > limit {
		t.Errorf("%d reloads during a %s flood with max-delay 1s, want at most %d", h, flood, limit)
	}
}
