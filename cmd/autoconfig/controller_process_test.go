package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/testbin"

	"github.com/modelsphere/autoconfig/internal/testenv"
)

// These tests run `autoconfig controller` as real processes (the test
// binary, which testscript.Main puts on $PATH as autoconfig) against a real
// API server, some through a TCP proxy that can refuse, black-hole or
// forward connections.

// controllerProc is one `autoconfig controller` process.
type controllerProc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	out  *testbin.SyncBuffer
	done chan struct{}
	err  error
	addr string // of the health probes
}

// freeAddr is a local address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func startController(t *testing.T, name string, args ...string) *controllerProc {
	t.Helper()
	bin, err := exec.LookPath("autoconfig")
	if err != nil {
		t.Fatalf("autoconfig is not on $PATH (testscript.Main puts it there): %v", err)
	}
	p := &controllerProc{t: t, name: name, out: &testbin.SyncBuffer{}, done: make(chan struct{}), addr: freeAddr(t)}
	p.cmd = exec.Command(bin, append([]string{"controller", "--metrics-bind-address", "0", "--health-probe-bind-address", p.addr}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", p.name, p.out.String())
		}
	})
	return p
}

func (p *controllerProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitLog waits until the output matches re, and fails when the process
// exits first or after timeout.
func (p *controllerProc) waitLog(re string, timeout time.Duration) string {
	p.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(timeout)
	for {
		if m := rx.FindString(p.out.String()); m != "" {
			return m
		}
		if p.exited() {
			p.t.Fatalf("%s exited (%v) before logging %q", p.name, p.err, re)
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s logged no %q within %v", p.name, re, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// probe is the status code of GET path on the probe address, 0 when it
// cannot connect.
func (p *controllerProc) probe(path string) int {
	p.t.Helper()
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + p.addr + path)
	if err != nil {
		return 0 // not listening yet
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (p *controllerProc) waitReady(timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for p.probe("/readyz") != http.StatusOK {
		if p.exited() {
			p.t.Fatalf("%s exited (%v) before it was ready", p.name, p.err)
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s not ready within %v", p.name, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop sends SIGTERM and returns the exit code.
func (p *controllerProc) stop() int {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatal(err)
	}
	return p.wait(30 * time.Second)
}

func (p *controllerProc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %v", p.name, timeout)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		p.t.Fatalf("%s: %v", p.name, p.err)
	}
	return 0
}

// errorLines are the output's ERROR lines: slog's and klog's.
func (p *controllerProc) errorLines() []string {
	var bad []string
	klogErr := regexp.MustCompile(`^E\d{4} `)
	for l := range strings.SplitSeq(p.out.String(), "\n") {
		if strings.Contains(l, "level=ERROR") || klogErr.MatchString(l) {
			bad = append(bad, l)
		}
	}
	return bad
}

// proxiedKubeconfig is src with its server's address replaced by addr;
// it returns the new file and the original server's host:port.
func proxiedKubeconfig(t *testing.T, src, addr string) (string, string) {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(src)
	if err != nil {
		t.Fatal(err)
	}
	var target string
	for _, c := range kc.Clusters {
		u := strings.TrimPrefix(c.Server, "https://")
		target = strings.TrimSuffix(u, "/")
		c.Server = "https://" + addr
	}
	out := filepath.Join(t.TempDir(), "proxied")
	if err := clientcmd.WriteToFile(*kc, out); err != nil {
		t.Fatal(err)
	}
	return out, target
}

// kubeconfigTarget is the host:port of src's server.
func kubeconfigTarget(t *testing.T, src string) string {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range kc.Clusters {
		return strings.TrimSuffix(strings.TrimPrefix(c.Server, "https://"), "/")
	}
	t.Fatal("no cluster in " + src)
	return ""
}

// routeFixture is a namespace with one route, its Service and
// EndpointSlice, and its output ConfigMap.
func routeFixture(ns, route string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: v1
kind: Service
metadata: {name: vid, namespace: %[1]s}
spec:
  ports: [{name: http, port: 8000, targetPort: 8000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: vid-1
  namespace: %[1]s
  labels: {kubernetes.io/service-name: vid}
addressType: IPv4
ports: [{name: http, port: 8000, protocol: TCP}]
endpoints:
- addresses: [10.2.0.1]
  conditions: {ready: true}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: routes, namespace: %[1]s}
---
%[3]s`, ns, route, routeDoc(ns, route))
}

func routeDoc(ns, route string) string {
	return fmt.Sprintf(`apiVersion: routing.modelsphere.dev/v1alpha1
kind: ModelRoute
metadata: {name: %[2]s, namespace: %[1]s}
spec:
  modelType: video
  discovery: {service: vid}
  nginx:
    outputConfigMap: routes
    peers:
    - {use: backend}
`, ns, route)
}

// waitKey waits until the route's key is in its ConfigMap: the route was
// reconciled (by a leader).
func waitKey(t *testing.T, sc *scriptCluster, ns, route string, timeout time.Duration) {
	t.Helper()
	key := "session_route_" + route + ".conf"
	deadline := time.Now().Add(timeout)
	for {
		var cm corev1.ConfigMap
		if err := sc.admin.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "routes"}, &cm); err == nil {
			if _, ok := cm.Data[key]; ok {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/routes has no key %s within %v", ns, key, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func startCluster(t *testing.T) *scriptCluster {
	t.Helper()
	sc, err := startScriptCluster(diffRole(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.stop)
	return sc
}

// TestControllerWaitsForAPIServer: a replica that cannot reach the API
// server (connections refused, then black-holed) keeps running — alive but
// not ready — and logs what it waits for; once the API server is reachable
// it sets up, becomes leader and ready, and reconciles a route.
func TestControllerWaitsForAPIServer(t *testing.T) {
	sc := startCluster(t)
	if err := sc.apply(routeFixture("wait1", "r1")); err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewTCPProxy(t, kubeconfigTarget(t, sc.adminKubeconfig), testenv.ProxyRefuse)
	kc, _ := proxiedKubeconfig(t, sc.adminKubeconfig, proxy.Addr())
	c := startController(t, "controller", "--kubeconfig", kc, "--namespace", "wait1", "--leader-elect", "--leader-election-namespace", "wait1")

	// Refused: it waits, says for what, and is alive but not ready.
	c.waitLog(`(?s)API server not reachable.*API server not reachable`, 20*time.Second)
	if got := c.probe("/healthz"); got != http.StatusOK {
		t.Errorf("/healthz while waiting: %d, want 200", got)
	}
	if got := c.probe("/readyz"); got != http.StatusInternalServerError { // controller-runtime's healthz handler
		t.Errorf("/readyz while waiting: %d, want 500", got)
	}
	if !strings.Contains(c.out.String(), "waitingFor=") {
		t.Error("the wait does not say what it waits for")
	}
	// Black-holed: each attempt times out instead of hanging.
	proxy.SetMode(testenv.ProxyBlackhole)
	c.waitLog(`API server not reachable.*(Timeout|timeout|deadline)`, 30*time.Second)
	if c.exited() {
		t.Fatalf("exited while the API server was black-holed: %v", c.err)
	}
	proxy.SetMode(testenv.ProxyForward)
	c.waitLog(`msg="API server reachable"`, 30*time.Second)
	c.waitReady(60 * time.Second)
	waitKey(t, sc, "wait1", "r1", 60*time.Second)
	if code := c.stop(); code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0", code)
	}
	if bad := c.errorLines(); len(bad) > 0 {
		t.Errorf("ERROR lines:\n%s", strings.Join(bad, "\n"))
	}
}

// TestControllerSIGTERMWhileWaiting: SIGTERM while waiting for the API
// server exits 0 at once, without an error.
func TestControllerSIGTERMWhileWaiting(t *testing.T) {
	proxy := testenv.NewTCPProxy(t, "127.0.0.1:1", testenv.ProxyRefuse)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://`+proxy.Addr()+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startController(t, "controller", "--kubeconfig", kc, "--leader-elect", "--leader-election-namespace", "default")
	c.waitLog(`API server not reachable`, 20*time.Second)
	start := time.Now()
	if code := c.stop(); code != 0 {
		t.Errorf("exit %d after SIGTERM while waiting, want 0", code)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("SIGTERM took %v to end the wait", d)
	}
	if bad := c.errorLines(); len(bad) > 0 {
		t.Errorf("ERROR lines:\n%s", strings.Join(bad, "\n"))
	}
}

// TestControllerCleanShutdownNoError: of two replicas with leader
// election, SIGTERM ends the standby (which never led) and the leader with
// exit 0 and no ERROR line; the standby that is left takes over.
func TestControllerCleanShutdownNoError(t *testing.T) {
	sc := startCluster(t)
	if err := sc.apply(routeFixture("le1", "r1")); err != nil {
		t.Fatal(err)
	}
	args := []string{"--kubeconfig", sc.adminKubeconfig, "--namespace", "le1", "--leader-elect", "--leader-election-namespace", "le1"}
	leader := startController(t, "leader", args...)
	waitKey(t, sc, "le1", "r1", 60*time.Second)
	leader.waitReady(30 * time.Second)

	standby := startController(t, "standby", args...)
	standby.waitReady(60 * time.Second)
	// It competes for the Lease (and has tried at least once).
	standby.waitLog(`Attempting to acquire leader lease`, 30*time.Second)
	time.Sleep(time.Second)
	if code := standby.stop(); code != 0 {
		t.Errorf("standby: exit %d after SIGTERM, want 0", code)
	}
	if bad := standby.errorLines(); len(bad) > 0 {
		t.Errorf("standby: ERROR lines on a clean shutdown:\n%s", strings.Join(bad, "\n"))
	}

	next := startController(t, "next", args...)
	next.waitReady(60 * time.Second)
	next.waitLog(`Attempting to acquire leader lease`, 30*time.Second)
	if code := leader.stop(); code != 0 {
		t.Errorf("leader: exit %d after SIGTERM, want 0", code)
	}
	if bad := leader.errorLines(); len(bad) > 0 {
		t.Errorf("leader: ERROR lines on a clean shutdown:\n%s", strings.Join(bad, "\n"))
	}
	// The leader released the Lease: the other replica leads and reconciles.
	if err := sc.apply(routeDoc("le1", "r2")); err != nil {
		t.Fatal(err)
	}
	waitKey(t, sc, "le1", "r2", 30*time.Second)
	if code := next.stop(); code != 0 {
		t.Errorf("next leader: exit %d after SIGTERM, want 0", code)
	}
	if bad := next.errorLines(); len(bad) > 0 {
		t.Errorf("next leader: ERROR lines on a clean shutdown:\n%s", strings.Join(bad, "\n"))
	}
}

// TestControllerLeaseLostIsAnError: a leader cut off from the API server
// for longer than its renew deadline stops leading, says so at ERROR and
// exits 1.
func TestControllerLeaseLostIsAnError(t *testing.T) {
	sc := startCluster(t)
	if err := sc.apply(routeFixture("lost1", "r1")); err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewTCPProxy(t, kubeconfigTarget(t, sc.adminKubeconfig), testenv.ProxyForward)
	kc, _ := proxiedKubeconfig(t, sc.adminKubeconfig, proxy.Addr())
	c := startController(t, "leader", "--kubeconfig", kc, "--namespace", "lost1", "--leader-elect", "--leader-election-namespace", "lost1",
		"--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "500ms")
	waitKey(t, sc, "lost1", "r1", 60*time.Second)
	proxy.SetMode(testenv.ProxyRefuse)
	if code := c.wait(30 * time.Second); code != 1 {
		t.Errorf("exit %d after losing the lease, want 1", code)
	}
	if !regexp.MustCompile(`level=ERROR.*leader election lost`).MatchString(c.out.String()) {
		t.Errorf("losing the lease is not an ERROR line naming it:\n%s", c.out.String())
	}
}
