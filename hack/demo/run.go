package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/internal/testenv"
)

// demo is one run's state.
type demo struct {
	o     options
	out   io.Writer
	root  string // module root
	tmp   string // everything this run creates on disk
	bin   string // built binaries
	kube  string // kubeconfig path
	c     client.Client
	host  net.IP // a non-loopback local address the backends listen on
	nginx *nginxtest.Nginx
	// procs are the subprocesses, stopped in reverse order on exit.
	procs []*proc
	// video and llm are the running local video and vLLM stand-in
	// backends, in start order.
	video, llm []*backend
	// last holds the previously shown content of each rendered output.
	last map[string]string
	// ctrlHealth is the controller's health address.
	ctrlHealth, ctrlMetrics string
	// reloadMetrics is the reload sidecar's metrics address.
	reloadMetrics string
	// noNginx says why the nginx data plane is off ("" when it is on).
	noNginx string
}

// Names of what the demo creates (the sample routes' references).
const (
	routeNS      = "llm-route"
	nginxCM      = "openresty-conf"
	openrestyPod = "openresty-0"
	cartCM       = "qwen-cart-config"
	monitorNS    = "monitoring"
	monitorCM    = "monitor-conf"
	llmRoute     = "qwen"
	llmModel     = "Qwen/Qwen2.5-72B-Instruct"
	videoRoute   = "wan-video"
	videoAPIKey  = "sk-video-1"
	llmBackendNS = "llm"
	videoNS      = "video"
)

func run(ctx context.Context, out io.Writer, o options) (err error) {
	d := &demo{o: o, out: out, last: map[string]string{}}
	if d.root, err = testbin.ModuleRoot(); err != nil {
		return err
	}
	if d.tmp, err = os.MkdirTemp("", "autoconfig-demo-"); err != nil {
		return err
	}
	defer func() {
		if o.Keep {
			fmt.Fprintf(out, "\nkept %s (logs, kubeconfig, rendered files)\n", d.tmp)
			return
		}
		os.RemoveAll(d.tmp)
	}()
	defer d.stopProcs()
	defer d.stopBackends()

	useNginx, why := d.nginxWanted()
	d.title("autoconfig demo: a real control plane, the real controller, routes that follow scaling")
	d.say("work dir %s (removed on exit)", d.tmp)

	d.step("building autoconfig and reload")
	if err := d.build(ctx); err != nil {
		return err
	}

	d.step("starting a local control plane (kube-apiserver + etcd from envtest, CRD from deploy/crds)")
	env, err := testenv.Environment()
	if err != nil {
		return err
	}
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("start control plane: %w", err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(out, "demo: stop control plane: %v\n", err)
		}
	}()
	// Subprocesses hold watches on the API server: stop them before it.
	defer d.stopProcs()
	d.kube = filepath.Join(d.tmp, "kubeconfig")
	if err := os.WriteFile(d.kube, env.KubeConfig, 0o600); err != nil {
		return err
	}
	d.say("API server %s; kubeconfig %s", cfg.Host, d.kube)
	if d.c, err = client.New(cfg, client.Options{Scheme: scheme.Scheme}); err != nil {
		return err
	}
	if d.host, err = localIP(); err != nil {
		return err
	}

	d.step("creating what the consumers' charts would: namespaces, Services, ConfigMaps")
	if err := d.setupCluster(ctx); err != nil {
		return err
	}

	sockDir := compiler.DefaultSockDir
	if useNginx {
		d.step("starting an nginx data plane (/usr/sbin/nginx + lua module) and the reload sidecar in API mode")
		if err := d.startNginx(ctx); err != nil {
			return err
		}
		sockDir = d.nginx.SockDir()
	} else {
		d.noNginx = why
		d.say("no nginx data plane: %s", why)
	}

	d.step("starting `autoconfig controller`")
	if err := d.startController(ctx, sockDir); err != nil {
		return err
	}

	d.step("applying deploy/samples/modelroute-llm.yaml and modelroute-video.yaml")
	if err := d.applySamples(ctx); err != nil {
		return err
	}
	if err := d.scenes(ctx); err != nil {
		return err
	}
	d.title("done: every scene converged")
	return nil
}

func (d *demo) nginxWanted() (bool, string) {
	if d.o.Nginx == "off" {
		return false, "disabled with -nginx off"
	}
	for _, f := range []string{nginxtest.NginxBinary, nginxtest.NDKModule, nginxtest.LuaModule} {
		if _, err := os.Stat(f); err != nil {
			if d.o.Nginx == "on" {
				return true, ""
			}
			return false, f + " is not installed (make deps installs nginx + libnginx-mod-http-lua)"
		}
	}
	return true, ""
}

// build compiles the binaries the demo runs.
func (d *demo) build(ctx context.Context) error {
	d.bin = filepath.Join(d.tmp, "bin")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", d.bin+"/", "./cmd/autoconfig", "./cmd/reload")
	cmd.Dir = d.root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, b)
	}
	return nil
}

// startController runs `autoconfig controller` against the local API
// server with health and metrics on free loopback ports.
func (d *demo) startController(ctx context.Context, sockDir string) error {
	hp, err := nginxtest.FreePort()
	if err != nil {
		return err
	}
	// Two FreePort calls may return the same port (each listener is
	// closed before the next call): ask again until they differ.
	mp := hp
	for mp == hp {
		if mp, err = nginxtest.FreePort(); err != nil {
			return err
		}
	}
	d.ctrlHealth = "127.0.0.1:" + strconv.Itoa(hp)
	d.ctrlMetrics = "127.0.0.1:" + strconv.Itoa(mp)
	args := []string{"controller",
		"--kubeconfig", d.kube,
		"--leader-elect=false",
		"--health-probe-bind-address", d.ctrlHealth,
		"--metrics-bind-address", d.ctrlMetrics,
		"--sock-dir", sockDir,
	}
	bin := filepath.Join(d.bin, "autoconfig")
	if d.o.Autoconfig != "" {
		bin = d.o.Autoconfig
	}
	p, err := d.start("controller", bin, args...)
	if err != nil {
		return err
	}
	d.say("autoconfig %s", shellJoin(args))
	d.say("logs: %s", p.LogPath)
	return d.waitFor(ctx, "controller /readyz", func() (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("controller exited: %s", tail(p))
		}
		return httpOK("http://" + d.ctrlHealth + "/readyz"), nil
	})
}

// startNginx launches nginx from a private prefix whose routes directory
// is kept in step with the openresty ConfigMap by the reload binary.
func (d *demo) startNginx(ctx context.Context) error {
	routes := filepath.Join(d.tmp, "routes")
	n, err := nginxtest.Launch(nginxtest.Options{
		RoutesDir: routes,
		// The shipped deploy/openresty/nginx.conf (paths moved to a
		// private prefix) with the reference lua engine
		// (deploy/openresty/lua/router*.lua), the `router` module the llm
		// route files call: tiers, session affinity, decode-SLO
		// admission (its http-level body filter measures the streams),
		// retry on connect failure, ejection, probes. Two workers, so
		// the engine's state shared between them is in play.
		Reference: true,
		Workers:   2,
	})
	if err != nil {
		return err
	}
	d.nginx = n
	d.procs = append(d.procs, &proc{name: "nginx", stop: n.Close})
	d.say("nginx (deploy/openresty/nginx.conf, 2 workers) dispatch on %s, routes from %s, lua engine from deploy/openresty/lua", n.Addr(), routes)
	mp, err := nginxtest.FreePort()
	if err != nil {
		return err
	}
	d.reloadMetrics = "127.0.0.1:" + strconv.Itoa(mp)
	args := []string{
		"--configmap", routeNS + "/" + nginxCM, "--write-dir", routes, "--kubeconfig", d.kube,
		"--process", n.MasterMatch(), "--sock-dir", n.SockDir(),
		"--pod-name", openrestyPod, "--pod-namespace", routeNS,
		"--debounce", "200ms", "--metrics-addr", d.reloadMetrics,
		// the scale-to-zero scene's idleAfter is 10 s: a 2 s step of the
		// last request's time (the default is 10 s)
		"--demand-granularity", "2s",
	}
	p, err := d.start("reload", filepath.Join(d.bin, "reload"), args...)
	if err != nil {
		return err
	}
	d.say("reload %s", shellJoin(args))
	d.say("logs: %s", p.LogPath)
	return nil
}

func httpOK(url string) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// localIP returns a non-loopback, non-link-local address of this machine:
// the API server rejects loopback endpoint addresses (127.0.0.0/8, ::1), so
// the local backends listen on the machine's own address instead.
func localIP() (net.IP, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var v6 net.IP
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || !ipn.IP.IsGlobalUnicast() {
			continue
		}
		if ip4 := ipn.IP.To4(); ip4 != nil {
			return ip4, nil
		}
		if v6 == nil {
			v6 = ipn.IP
		}
	}
	if v6 != nil {
		return v6, nil
	}
	return nil, errors.New("no non-loopback address on this machine: EndpointSlices cannot point at 127.0.0.1, so the demo's backends need one")
}

// waitFor polls cond until it is true, it fails, or the timeout passes.
func (d *demo) waitFor(ctx context.Context, what string, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, d.o.Timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%s: not reached within %s%s", what, d.o.Timeout, d.procTails())
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func (d *demo) pause(ctx context.Context) {
	if d.o.Pause <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(d.o.Pause):
	}
}

func (d *demo) title(s string) { fmt.Fprintf(d.out, "\n=== %s\n", s) }
func (d *demo) step(s string)  { fmt.Fprintf(d.out, "\n--> %s\n", s) }
func (d *demo) say(format string, args ...any) {
	fmt.Fprintf(d.out, "    "+format+"\n", args...)
}

// shellJoin quotes arguments with spaces, for display.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'") {
			a = strconv.Quote(a)
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}
