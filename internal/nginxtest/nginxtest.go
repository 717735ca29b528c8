// Package nginxtest runs a real nginx master (Debian's nginx with the lua
// module) from a private prefix, for tests and demos across the repository.
//
// It stands in for the production openresty image: an http{} block that
// includes every "*.conf" of a routes directory (like the image's
// conf.d/routes/), and a dispatch server on a free loopback TCP port that
// forwards "/<route>/…" unchanged to "unix:<SockDir>/<route>.sock", the
// socket the per-route server listens on.
//
// Usage in a test:
//
//	n := nginxtest.Start(t, nginxtest.Options{})
//	os.WriteFile(filepath.Join(n.RoutesDir(), "session_route_a.conf"), conf, 0o644)
//	if err := n.Reload(); err != nil { t.Fatal(err) }
//	resp, err := http.Get(n.URL("a") + "v1/models")
//
// A route file must listen on the socket returned by SockPath(route), e.g.
// "listen unix:" + n.SockPath("a") + ";". Start fails the test (never skips)
// when /usr/sbin/nginx or the lua module is missing; install them with
//
//	apt-get install -y --no-install-recommends nginx libnginx-mod-http-lua lua-cjson
//
// The master runs in the foreground ("daemon off") as a child of the test
// process, so it is reaped and stopped by the cleanup registered with
// t.Cleanup. Programs that are not tests use Launch and Close.
//
// MasterMatch returns a string that is a prefix of this master's argv[0]
// and of no other nginx master's, so tests can point a process matcher at
// exactly this instance even when other nginx instances run on the machine.
package nginxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/template"
	"time"

	"github.com/prometheus/procfs"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/internal/reload"
)

// Paths of the system nginx and its dynamic modules (Debian packages nginx
// and libnginx-mod-http-lua).
const (
	NginxBinary = "/usr/sbin/nginx"
	NDKModule   = "/usr/lib/nginx/modules/ndk_http_module.so"
	LuaModule   = "/usr/lib/nginx/modules/ngx_http_lua_module.so"
)

// RepoDir is the repository's root directory (from this source file's
// path, so it is right in every package's tests).
func RepoDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

// RouterLuaPath is the lua_package_path entry of the reference routing
// engine, deploy/openresty/lua/router.lua: the module every llm data-plane
// test loads (Options.LuaPackagePath).
func RouterLuaPath() string {
	return filepath.Join(RepoDir(), "deploy", "openresty", "lua", "?.lua")
}

// timeout bounds every wait of this package (startup, reload, stop). nginx
// needs well under a second for each; the margin is for a loaded CI machine.
const timeout = 15 * time.Second

// Options configure the nginx instance. The zero value is usable.
type Options struct {
	// HTTPConfig is inserted verbatim inside http{}, before the routes
	// include (lua_shared_dict, init_by_lua_block, upstream zones, …).
	HTTPConfig string
	// MainConfig is inserted verbatim in the main context (env, …).
	MainConfig string
	// LuaPackagePath sets lua_package_path (";;" is appended).
	LuaPackagePath string
	// RoutesDir is the directory whose "*.conf" files http{} includes.
	// Default: <prefix>/conf/routes (created empty).
	RoutesDir string
	// Workers is worker_processes (default 1).
	Workers int
	// ErrorLogLevel is the error_log level (default "info", which shows
	// reloads and deleted sockets).
	ErrorLogLevel string
	// Reference runs the repository's deploy/openresty/nginx.conf (the
	// reference configuration for stock openresty) instead of this
	// package's template, with only what Debian's nginx and a private
	// prefix need changed: load_module lines, daemon off, temp paths, and
	// the openresty paths rewritten to the prefix (sockets, routes, logs),
	// to deploy/openresty/lua (lua_package_path) and to a loopback port.
	// The engine's control socket is ControlSockPath and its seed files
	// (peers_<route>.json) are read from RoutesDir.
	// LuaPackagePath and MainConfig are ignored; HTTPConfig is inserted at
	// the top of http{}. worker_rlimit_nofile is lowered to the test
	// process's hard limit of open files when that is smaller (only a
	// process with CAP_SYS_RESOURCE could raise it).
	Reference bool
	// Replace (Options.Reference only) rewrites the reference
	// configuration after the rewrites above: each pair's first string
	// must occur exactly once and is replaced by the second (e.g. a test
	// of a smaller worker_connections).
	Replace [][2]string
}

// Nginx is one running (or stopped) nginx master with its private prefix.
type Nginx struct {
	opts      Options
	prefix    string
	sockDir   string
	routesDir string
	port      int
	// metricsPort is the engine's metrics port (Options.Reference: the
	// shipped nginx.conf's "listen 9145").
	metricsPort int

	cmd    *exec.Cmd
	exited chan struct{}
}

// Start launches nginx and registers its stop and the removal of its prefix
// with t.Cleanup. Any failure fails the test with the error log.
func Start(t testing.TB, opts Options) *Nginx {
	t.Helper()
	n, err := Launch(opts)
	if err != nil {
		t.Fatalf("nginxtest: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nginx error log (%s):\n%s", n.prefix, n.ErrorLog())
		}
		// Stopping nginx is the harness's clean-up, not what a test
		// asserts (tests of a graceful stop call Stop themselves): a
		// graceful stop that outlasts its bound (a worker still busy
		// with a connection, once in about twenty runs of a long test)
		// is killed and reported, with the error log, not failed.
		if err := n.Stop(); err != nil {
			t.Logf("nginxtest: %v (killed); nginx error log (%s):\n%s", err, n.prefix, n.ErrorLog())
		}
		if err := n.Close(); err != nil {
			t.Errorf("nginxtest: %v", err)
		}
	})
	return n
}

// Launch creates a private prefix and starts nginx in it. The caller must
// call Close.
func Launch(opts Options) (*Nginx, error) {
	for _, f := range []string{NginxBinary, NDKModule, LuaModule} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("%s is missing (apt-get install -y --no-install-recommends nginx libnginx-mod-http-lua lua-cjson): %w", f, err)
		}
	}
	if opts.Workers <= 0 {
		opts.Workers = 1
	}
	if opts.ErrorLogLevel == "" {
		opts.ErrorLogLevel = "info"
	}
	// os.MkdirTemp("", …) keeps socket paths short: a unix socket path is
	// limited to 108 bytes, and t.TempDir() paths can be far longer.
	prefix, err := os.MkdirTemp("", "ngx")
	if err != nil {
		return nil, err
	}
	n := &Nginx{opts: opts, prefix: prefix, sockDir: filepath.Join(prefix, "sock"), routesDir: opts.RoutesDir}
	if n.routesDir == "" {
		n.routesDir = filepath.Join(prefix, "conf", "routes")
	} else if !filepath.IsAbs(n.routesDir) {
		n.routesDir = filepath.Join(prefix, n.routesDir)
	}
	for _, d := range []string{"conf", "logs", "tmp", n.sockDir, n.routesDir} {
		if !filepath.IsAbs(d) {
			d = filepath.Join(prefix, d)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			os.RemoveAll(prefix)
			return nil, err
		}
	}
	// A free port is picked by the kernel and released before nginx binds
	// it; another process may take it in between, so a bind failure retries
	// with a new port (4 attempts, no wait).
	addrInUse := func(error) bool {
		if !strings.Contains(n.ErrorLog(), "Address already in use") {
			return false
		}
		os.Remove(n.errorLogPath())
		return true
	}
	if err := retry.OnError(wait.Backoff{Steps: 4}, addrInUse, func() error {
		var err error
		if n.port, err = FreePort(); err != nil {
			return err
		}
		if n.opts.Reference {
			if n.metricsPort, err = FreePort(); err != nil {
				return err
			}
		}
		if err := n.writeConfig(); err != nil {
			return err
		}
		return n.Relaunch()
	}); err != nil {
		os.RemoveAll(prefix)
		return nil, err
	}
	return n, nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

var confTemplate = template.Must(template.New("nginx.conf").Parse(`# written by internal/nginxtest
daemon off;
master_process on;
worker_processes {{.Workers}};
{{if .Root}}user root;
{{end}}error_log {{.Prefix}}/logs/error.log {{.Level}};
pid {{.Prefix}}/logs/nginx.pid;
load_module {{.NDK}};
load_module {{.Lua}};
{{.Main}}
events {
    worker_connections 1024;
}

http {
    access_log off;
    client_body_temp_path {{.Prefix}}/tmp/client_body;
    proxy_temp_path {{.Prefix}}/tmp/proxy;
    fastcgi_temp_path {{.Prefix}}/tmp/fastcgi;
    uwsgi_temp_path {{.Prefix}}/tmp/uwsgi;
    scgi_temp_path {{.Prefix}}/tmp/scgi;
{{if .LuaPath}}    lua_package_path "{{.LuaPath}};;";
{{end}}
{{.HTTP}}
    include {{.Routes}}/*.conf;

    # Dispatch: a fixture standing in for the production image's :8080
    # server. The URI is forwarded unchanged (/<route>/…).
    server {
        listen 127.0.0.1:{{.Port}};
        location = /_nginxtest/health {
            return 200 "ok\n";
        }
        location ~ ^/(?<route>[a-z0-9._-]+)/ {
            proxy_pass http://unix:{{.Sock}}/$route.sock:;
            proxy_set_header X-Real-IP $remote_addr;
            proxy_set_header Host $host;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            client_max_body_size 0;
            proxy_read_timeout 3600s;
        }
    }
}
`))

// referenceConfig is deploy/openresty/nginx.conf adapted to this instance
// (Options.Reference). Every rewritten line must be present exactly once,
// so a change of the reference file fails loudly here.
func (n *Nginx) referenceConfig() ([]byte, error) {
	path := filepath.Join(RepoDir(), "deploy", "openresty", "nginx.conf")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	conf := string(b)
	const openresty = "/usr/local/openresty/nginx/"
	var head strings.Builder
	head.WriteString("# deploy/openresty/nginx.conf, adapted by internal/nginxtest\ndaemon off;\n")
	if os.Geteuid() == 0 {
		head.WriteString("user root;\n")
	}
	fmt.Fprintf(&head, "load_module %s;\nload_module %s;\n", NDKModule, LuaModule)
	temp := "http {\n"
	for _, d := range []string{"client_body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		temp += fmt.Sprintf("    %s_temp_path %s/tmp/%s;\n", d, n.prefix, d)
	}
	temp += n.opts.HTTPConfig + "\n"
	for _, r := range [][2]string{
		{"worker_processes auto;", fmt.Sprintf("worker_processes %d;", n.opts.Workers)},
		{"error_log logs/error.log info;", fmt.Sprintf("error_log %s info;", n.errorLogPath())},
		{"pid logs/nginx.pid;", "pid " + filepath.Join(n.prefix, "logs", "nginx.pid") + ";"},
		{"http {\n", temp},
		{`lua_package_path "` + openresty + `lua/?.lua;;";`, `lua_package_path "` + RouterLuaPath() + `;;";`},
		{"include conf.d/routes/*.conf;", "include " + n.routesDir + "/*.conf;"},
		{"listen 8080;", fmt.Sprintf("listen 127.0.0.1:%d;", n.port)},
		{"listen 9145;", fmt.Sprintf("listen 127.0.0.1:%d;", n.metricsPort)},
		{"http://unix:" + openresty + "sock/", "http://unix:" + n.sockDir + "/"},
		{"listen unix:" + openresty + "sock/" + ControlSocket + ";", "listen unix:" + n.ControlSockPath() + ";"},
		{`peers_dir = "` + openresty + `conf/conf.d/routes"`, `peers_dir = "` + n.routesDir + `"`},
		{"worker_rlimit_nofile 32768;", fmt.Sprintf("worker_rlimit_nofile %d;", rlimitNofile(32768))},
	} {
		if c := strings.Count(conf, r[0]); c != 1 {
			return nil, fmt.Errorf("%s: %q occurs %d times, want once", path, r[0], c)
		}
		conf = strings.Replace(conf, r[0], r[1], 1)
	}
	for _, r := range n.opts.Replace {
		if c := strings.Count(conf, r[0]); c != 1 {
			return nil, fmt.Errorf("%s: Options.Replace: %q occurs %d times, want once", path, r[0], c)
		}
		conf = strings.Replace(conf, r[0], r[1], 1)
	}
	for _, line := range strings.Split(conf, "\n") {
		if l := strings.TrimSpace(line); !strings.HasPrefix(l, "#") && strings.Contains(l, openresty) {
			return nil, fmt.Errorf("%s: openresty path left after the rewrite: %s", path, l)
		}
	}
	return []byte(head.String() + conf), nil
}

// rlimitNofile is want, or the process's hard limit of open files when
// that is smaller (nginx's workers inherit it).
func rlimitNofile(want uint64) uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil && rl.Max < want {
		return rl.Max
	}
	return want
}

func (n *Nginx) writeConfig() error {
	if n.opts.Reference {
		conf, err := n.referenceConfig()
		if err != nil {
			return err
		}
		return os.WriteFile(n.ConfPath(), conf, 0o644)
	}
	var b bytes.Buffer
	err := confTemplate.Execute(&b, map[string]any{
		"Workers": n.opts.Workers,
		"Root":    os.Geteuid() == 0,
		"Prefix":  n.prefix,
		"Level":   n.opts.ErrorLogLevel,
		"NDK":     NDKModule,
		"Lua":     LuaModule,
		"Main":    n.opts.MainConfig,
		"LuaPath": n.opts.LuaPackagePath,
		"HTTP":    n.opts.HTTPConfig,
		"Routes":  n.routesDir,
		"Port":    n.port,
		"Sock":    n.sockDir,
	})
	if err != nil {
		return err
	}
	return os.WriteFile(n.ConfPath(), b.Bytes(), 0o644)
}

// Relaunch starts the master again after Stop or Kill9, on the same prefix,
// port and routes (what a container restart does).
func (n *Nginx) Relaunch() error {
	if n.running() {
		return errors.New("nginx is still running")
	}
	cmd := exec.Command(NginxBinary, "-p", n.prefix+"/", "-c", n.ConfPath())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start nginx: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	n.cmd, n.exited = cmd, exited

	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-exited:
			return fmt.Errorf("nginx exited at startup: %s\n%s\nerror log:\n%s", cmd.ProcessState, out.String(), n.ErrorLog())
		default:
		}
		if len(n.WorkerPIDs()) > 0 && n.healthy() {
			return nil
		}
		if time.Now().After(deadline) {
			n.Kill9()
			return fmt.Errorf("nginx did not answer on 127.0.0.1:%d within %s; error log:\n%s", n.port, timeout, n.ErrorLog())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (n *Nginx) healthy() bool {
	c := http.Client{Timeout: time.Second}
	path := "/_nginxtest/health"
	if n.opts.Reference {
		path = "/healthz"
	}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d%s", n.port, path))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (n *Nginx) running() bool {
	if n.exited == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// Prefix is the nginx prefix directory (conf/, logs/, tmp/, sock/).
func (n *Nginx) Prefix() string { return n.prefix }

// ConfPath is the absolute path of the main nginx.conf.
func (n *Nginx) ConfPath() string { return filepath.Join(n.prefix, "conf", "nginx.conf") }

// MetricsURL is the engine's metrics endpoint (Options.Reference only:
// the shipped nginx.conf's port 9145, moved to a free loopback port).
func (n *Nginx) MetricsURL() string {
	return fmt.Sprintf("http://127.0.0.1:%d/metrics", n.metricsPort)
}

// SockDir is the absolute directory of the per-route unix sockets.
func (n *Nginx) SockDir() string { return n.sockDir }

// SockPath is the socket a route's server must listen on.
func (n *Nginx) SockPath(route string) string { return filepath.Join(n.sockDir, route+".sock") }

// ControlSocket is the file name of the reference engine's control
// socket in the sock dir (deploy/openresty/nginx.conf; peers.ControlSocket).
const ControlSocket = peers.ControlSocket

// ControlSockPath is the reference engine's control socket (Options.Reference).
func (n *Nginx) ControlSockPath() string { return filepath.Join(n.sockDir, ControlSocket) }

// RoutesDir is the directory whose *.conf files are included in http{}.
func (n *Nginx) RoutesDir() string { return n.routesDir }

// Addr is the dispatch server's host:port.
func (n *Nginx) Addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

// URL is the dispatch URL of a route, ending in "/": "http://127.0.0.1:P/<route>/".
func (n *Nginx) URL(route string) string { return "http://" + n.Addr() + "/" + route + "/" }

// MasterMatch is a prefix of this master's argv[0] ("nginx: master process
// /usr/sbin/nginx -p <prefix>/") that no other instance shares.
func (n *Nginx) MasterMatch() string {
	return "nginx: master process " + NginxBinary + " -p " + n.prefix + "/"
}

// TestCommand is the argv of "nginx -t" for this instance's configuration.
func (n *Nginx) TestCommand() []string {
	return []string{NginxBinary, "-t", "-q", "-p", n.prefix + "/", "-c", n.ConfPath()}
}

// Test runs "nginx -t" on the current configuration; the error carries
// nginx's output.
func (n *Nginx) Test() error {
	argv := n.TestCommand()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("nginx -t: %w: %s", err, out)
	}
	return nil
}

// MasterPID is the master's pid, 0 when it is not running.
func (n *Nginx) MasterPID() int {
	if !n.running() {
		return 0
	}
	return n.cmd.Process.Pid
}

// WorkerPIDs lists the master's children from /proc (sorted), including
// old workers still draining after a reload.
func (n *Nginx) WorkerPIDs() []int {
	master := n.MasterPID()
	if master == 0 {
		return nil
	}
	return reload.Children("/proc", master)
}

// Signal sends sig to the master.
func (n *Nginx) Signal(sig syscall.Signal) error {
	pid := n.MasterPID()
	if pid == 0 {
		return errors.New("nginx is not running")
	}
	return syscall.Kill(pid, sig)
}

// Reload sends SIGHUP and waits until a new worker exists and every old
// worker has exited, so the next request is served by the new
// configuration (an old worker accepts for a moment after the new one
// starts). A configuration nginx rejects keeps the old workers, so Reload
// returns an error carrying the error log. Tests that keep a request open
// across a reload use Signal and WaitWorkersChanged instead.
func (n *Nginx) Reload() error {
	old := n.WorkerPIDs()
	if err := n.Signal(syscall.SIGHUP); err != nil {
		return err
	}
	if err := n.WaitWorkersChanged(context.Background(), old); err != nil {
		return err
	}
	return n.WaitWorkersGone(context.Background(), old)
}

// WaitWorkersGone waits until none of the pids in old is a running worker.
func (n *Nginx) WaitWorkersGone(ctx context.Context, old []int) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		left := false
		for _, p := range n.WorkerPIDs() {
			left = left || slices.Contains(old, p)
		}
		if !left {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("old nginx workers %v still running: %w", old, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// WaitWorkersChanged waits until the master has a worker not in old.
func (n *Nginx) WaitWorkersChanged(ctx context.Context, old []int) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		for _, p := range n.WorkerPIDs() {
			if !slices.Contains(old, p) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nginx workers did not change after reload (old %v): %w; error log:\n%s", old, ctx.Err(), n.ErrorLog())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Stop sends SIGQUIT (graceful shutdown, which removes the sockets) and
// waits for the master to exit.
func (n *Nginx) Stop() error {
	if !n.running() {
		return nil
	}
	n.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-n.exited:
		return nil
	case <-time.After(timeout):
		n.Kill9()
		return fmt.Errorf("nginx did not stop within %s after SIGQUIT", timeout)
	}
}

// Kill9 SIGKILLs the master and its workers, as a crashed container would,
// leaving the socket files behind; it waits for the master to be reaped and
// the workers to be gone.
func (n *Nginx) Kill9() error {
	if !n.running() {
		return nil
	}
	workers := n.WorkerPIDs()
	n.cmd.Process.Kill()
	for _, w := range workers {
		syscall.Kill(w, syscall.SIGKILL)
	}
	<-n.exited
	deadline := time.Now().Add(timeout)
	for _, w := range workers {
		// A killed worker is reparented and reaped by init (or stays a
		// zombie, which holds no socket): wait until it is not running.
		for alive(w) {
			if time.Now().After(deadline) {
				return fmt.Errorf("worker %d survived SIGKILL", w)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

func alive(pid int) bool {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return false
	}
	st, err := p.Stat()
	return err == nil && st.State != "Z" && st.State != "X"
}

func (n *Nginx) errorLogPath() string { return filepath.Join(n.prefix, "logs", "error.log") }

// ErrorLog returns the error log's content ("" if there is none yet).
func (n *Nginx) ErrorLog() string {
	b, _ := os.ReadFile(n.errorLogPath())
	return string(b)
}

// Close stops nginx and removes the prefix (sockets included).
func (n *Nginx) Close() error {
	err := n.Stop()
	if rmErr := os.RemoveAll(n.prefix); err == nil {
		err = rmErr
	}
	return err
}
