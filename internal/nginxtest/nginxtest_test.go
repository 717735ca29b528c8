package nginxtest

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func routeConf(n *Nginx, route, body string) string {
	return "server {\n    listen unix:" + n.SockPath(route) + ";\n" +
		"    location / { return 200 \"" + body + " $request_uri $http_x_real_ip\\n\"; }\n}\n"
}

func TestNginxLifecycle(t *testing.T) {
	n := Start(t, Options{HTTPConfig: "lua_shared_dict nginxtest 1m;"})

	// argv[0] of the master starts with MasterMatch; the workers do not.
	cmdline, err := os.ReadFile("/proc/" + itoa(n.MasterPID()) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(cmdline), n.MasterMatch()) {
		t.Fatalf("master cmdline %q does not start with %q", cmdline, n.MasterMatch())
	}
	workers := n.WorkerPIDs()
	if len(workers) != 1 {
		t.Fatalf("want 1 worker, got %v", workers)
	}

	// An unknown route has no socket: 502.
	if code, _ := Get(t, n.URL("a")+"x"); code != http.StatusBadGateway {
		t.Fatalf("unknown route: got %d, want 502", code)
	}

	if err := os.WriteFile(filepath.Join(n.RoutesDir(), "session_route_a.conf"), []byte(routeConf(n, "a", "route-a")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.Test(); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	if slices.Equal(n.WorkerPIDs(), workers) {
		t.Fatalf("workers unchanged after reload: %v", workers)
	}
	code, body := Get(t, n.URL("a")+"v2/x?y=1")
	if code != 200 || body != "route-a /a/v2/x?y=1 127.0.0.1\n" {
		t.Fatalf("route a: got %d %q", code, body)
	}

	// A broken file: nginx -t fails, a reload keeps the old workers.
	if err := os.WriteFile(filepath.Join(n.RoutesDir(), "session_route_b.conf"), []byte("server { bogus; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.Test(); err == nil {
		t.Fatal("nginx -t accepted a broken configuration")
	}
	if err := n.Reload(); err == nil {
		t.Fatal("Reload reported success on a broken configuration")
	}
	if code, _ := Get(t, n.URL("a")+"x"); code != 200 {
		t.Fatalf("old configuration stopped serving: %d", code)
	}
	os.Remove(filepath.Join(n.RoutesDir(), "session_route_b.conf"))

	// SIGKILL leaves the socket behind, and a restarted master cannot bind it.
	if err := n.Kill9(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(n.SockPath("a")); err != nil {
		t.Fatalf("socket should survive SIGKILL: %v", err)
	}
	if err := n.Relaunch(); err == nil || !strings.Contains(err.Error(), "Address already in use") {
		t.Fatalf("relaunch over a stale socket: got %v, want bind failure", err)
	}
	os.Remove(n.SockPath("a"))
	if err := n.Relaunch(); err != nil {
		t.Fatal(err)
	}
	if code, _ := Get(t, n.URL("a")+"x"); code != 200 {
		t.Fatalf("after relaunch: %d", code)
	}
	// A graceful stop removes the sockets.
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(n.SockPath("a")); err == nil {
		t.Fatal("socket left after SIGQUIT")
	}
	if n.Signal(syscall.SIGHUP) == nil {
		t.Fatal("signal to a stopped nginx succeeded")
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
