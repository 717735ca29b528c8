package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/reload/reloadtest"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// These tests inject a failure that heals by itself and check that the
// change is served afterwards without any further change of the content:
// before, an attempt that failed was forgotten until the next change.

// TestNginxAmbiguousTargetHealsWithoutAChange: a second process matching
// --process (a rolling restart, a debug shell) makes the target ambiguous;
// once it is gone the change is loaded, retried with backoff.
func TestNginxAmbiguousTargetHealsWithoutAChange(t *testing.T) {
	n, dir := startNginx(t, func(n *nginxtest.Nginx) map[string]string {
		return map[string]string{routeFile("a"): routeConf(n, "a", "a1")}
	})
	impostor := reloadtest.StartHUPCounter(t, n.MasterMatch())
	s := startSidecar(t, "--watch", dir, "--process", n.MasterMatch(), "--sock-dir", n.SockDir(), "--check-cmd", checkCmd(n), "--retry-max", "1s")

	reloadtest.KubeletSwap(t, dir, map[string]string{routeFile("a"): routeConf(n, "a", "a2")})
	s.waitCount(t, 1, "result=ambiguous")
	wantServes(t, n, "a", "a1")
	impostor.Stop()
	waitServes(t, n, "a", "a2")
	s.waitCount(t, 1, "result=success")
	if impostor.Count() != 0 {
		t.Fatal("the ambiguous match was signalled")
	}
}

// TestNginxRefusedReloadIsRetriedAtResync: nginx refuses the reload for a
// reason outside the watched files; the resync tick tries again.
func TestNginxRefusedReloadIsRetriedAtResync(t *testing.T) {
	extra := filepath.Join(t.TempDir(), "extra.conf")
	n, dir := startNginx(t, func(n *nginxtest.Nginx) map[string]string {
		return map[string]string{routeFile("a"): routeConf(n, "a", "a1")}
	})
	// No --check-cmd: nginx itself refuses the reload because a file the
	// route includes is missing (a volume not mounted yet); the old
	// configuration keeps serving. Once the file exists, the resync tick
	// loads the change.
	s := startSidecar(t, "--watch", dir, "--process", n.MasterMatch(), "--sock-dir", n.SockDir(), "--verify-timeout", "1s", "--resync", "1s")
	withInclude := fmt.Sprintf("server {\n    listen unix:%s;\n    include %s;\n    location / { return 200 \"a2\\n\"; }\n}\n", n.SockPath("a"), extra)
	reloadtest.KubeletSwap(t, dir, map[string]string{routeFile("a"): withInclude})
	s.waitCount(t, 1, "result=failed")
	wantServes(t, n, "a", "a1")
	if err := os.WriteFile(extra, []byte("# mounted\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitServes(t, n, "a", "a2")
	s.waitCount(t, 1, "result=success")
}

// TestAPIModeWriteFailureHeals: a directory left at a key's path (a real
// failure: the key's link cannot replace it) makes the write fail; it is
// retried with backoff and the key is served once the path is free,
// without a further ConfigMap change. The informer's resync is the second
// line of defence and is disabled here by a long --resync.
func TestAPIModeWriteFailureHeals(t *testing.T) {
	a, n, s, dir := startAPIMode(t, func(n *nginxtest.Nginx) map[string]string {
		return map[string]string{routeFile("a"): routeConf(n, "a", "a1")}
	}, "--retry-max", "1s", "--resync", "1h")
	waitServes(t, n, "a", "a1")
	blocker := filepath.Join(dir, routeFile("b"))
	if err := os.MkdirAll(filepath.Join(blocker, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	a.update(t, map[string]string{routeFile("a"): routeConf(n, "a", "a1"), routeFile("b"): routeConf(n, "b", "b1")})
	s.waitCount(t, 1, "cannot write the configmap's keys")
	if v := s.metric(t, `autoconfig_reload_configmap_writes_total{result="error"}`); v < 1 {
		t.Fatalf("configmap_writes_total{result=error} %v, want at least 1", v)
	}
	if err := os.RemoveAll(blocker); err != nil {
		t.Fatal(err)
	}
	waitServes(t, n, "b", "b1")
	wantServes(t, n, "a", "a1")
}

// TestAPIModeQuarantineLetsOtherRoutesThrough: route b's new version fails
// nginx -t while route a scales out. Before, the failing check blocked the
// whole reload, so a's new backend never reached nginx until b was fixed.
// Now b is quarantined (its last good version stays on disk and serving),
// a's change is served within max-delay plus the checks and the reload,
// and fixing b releases it.
func TestAPIModeQuarantineLetsOtherRoutesThrough(t *testing.T) {
	a, n, s, dir := startAPIMode(t, func(n *nginxtest.Nginx) map[string]string {
		return map[string]string{routeFile("a"): routeConf(n, "a", "a1"), routeFile("b"): routeConf(n, "b", "b1")}
	})
	waitServes(t, n, "a", "a1")
	waitServes(t, n, "b", "b1")

	// b breaks first; then a scales out while b is still broken.
	a.update(t, map[string]string{routeFile("a"): routeConf(n, "a", "a1"), routeFile("b"): brokenRoute(n, "b")})
	s.waitCount(t, 1, "quarantined:", "key="+routeFile("b"))
	t0 := time.Now()
	a.update(t, map[string]string{routeFile("a"): routeConf(n, "a", "a2"), routeFile("b"): brokenRoute(n, "b")})
	var served time.Time
	testbin.WaitFor(t, wait, "a's new version to be served", func() bool {
		_, body := nginxtest.Get(t, n.URL("a"))
		served = time.Now()
		return body == "a2\n"
	})
	t.Logf("a's change served %s after the ConfigMap update while b is quarantined (debounce 250ms, max-delay 2s)", served.Sub(t0).Round(time.Millisecond))
	wantServes(t, n, "b", "b1")
	if got, err := os.ReadFile(filepath.Join(dir, routeFile("b"))); err != nil || string(got) != routeConf(n, "b", "b1") {
		t.Fatalf("quarantined b on disk: %q, %v; want its last good version", got, err)
	}
	if v := s.metric(t, `autoconfig_reload_quarantined_keys`); v != 1 {
		t.Fatalf("quarantined_keys %v, want 1", v)
	}
	if s.count("quarantined:", "key="+routeFile("b")) != 1 {
		t.Fatalf("b's quarantine was reported more than once:\n%s", s.log.String())
	}

	// b fixed: released, served.
	a.update(t, map[string]string{routeFile("a"): routeConf(n, "a", "a2"), routeFile("b"): routeConf(n, "b", "b2")})
	waitServes(t, n, "b", "b2")
	s.waitCount(t, 1, "released from quarantine", "key="+routeFile("b"))
	if v := s.metric(t, `autoconfig_reload_quarantined_keys`); v != 0 {
		t.Fatalf("quarantined_keys %v after the fix, want 0", v)
	}
}
