package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/modelsphere/autoconfig/internal/reload/reloadtest"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// reloadBin is the real sidecar binary, built once by TestMain.
var reloadBin string

func TestMain(m *testing.M) {
	reloadtest.MaybeRunHUPCounter()
	// envtest's client logs through controller-runtime; nothing to show.
	ctrllog.SetLogger(logr.Discard())
	dir, err := os.MkdirTemp("", "reloadbin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if reloadBin, err = testbin.Build(dir, "reload"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// wait bounds every condition wait; nothing is a timing assertion.
const wait = 60 * time.Second

// sidecar is one running reload binary.
type sidecar struct {
	cmd         *exec.Cmd
	log         *testbin.SyncBuffer
	metricsAddr string
}

var metricsAddrRE = regexp.MustCompile(`msg="serving metrics" addr=(\S+)`)

// startSidecar runs the real binary with args plus a loopback metrics port
// and debug logs, and waits until it watches.
func startSidecar(t testing.TB, args ...string) *sidecar {
	t.Helper()
	s := &sidecar{log: &testbin.SyncBuffer{}}
	args = append([]string{"--metrics-addr=127.0.0.1:0", "--log-level=debug"}, args...)
	s.cmd = exec.Command(reloadBin, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait() }()
	t.Cleanup(func() {
		s.cmd.Process.Signal(syscall.SIGTERM)
		var err error
		select {
		case err = <-exited:
		case <-time.After(wait):
			s.cmd.Process.Kill()
			err = <-exited
		}
		if err != nil {
			t.Errorf("reload exited with %v after SIGTERM", err)
		}
		if t.Failed() {
			t.Logf("reload log:\n%s", s.log.String())
		}
	})
	testbin.WaitFor(t, wait, "the sidecar to watch", func() bool {
		select {
		case err := <-exited:
			t.Fatalf("reload exited at startup: %v\n%s", err, s.log.String())
		default:
		}
		return strings.Contains(s.log.String(), `msg=watching`)
	})
	m := metricsAddrRE.FindStringSubmatch(s.log.String())
	if m == nil {
		t.Fatalf("no metrics address in the log:\n%s", s.log.String())
	}
	s.metricsAddr = m[1]
	return s
}

// count is how many log lines contain all of the substrings.
func (s *sidecar) count(subs ...string) int {
	n := 0
	sc := bufio.NewScanner(strings.NewReader(s.log.String()))
	sc.Buffer(nil, 1<<20)
lines:
	for sc.Scan() {
		for _, sub := range subs {
			if !strings.Contains(sc.Text(), sub) {
				continue lines
			}
		}
		n++
	}
	return n
}

// waitCount waits until count(subs...) >= n.
func (s *sidecar) waitCount(t testing.TB, n int, subs ...string) {
	t.Helper()
	testbin.WaitFor(t, wait, fmt.Sprintf("%d log lines with %q", n, subs), func() bool { return s.count(subs...) >= n })
}

// metric scrapes /metrics for one sample, e.g.
// `autoconfig_reload_reloads_total{result="failed"}`.
func (s *sidecar) metric(t testing.TB, sample string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + s.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("sample %s not in /metrics:\n%s", sample, b)
	return 0
}

func (s *sidecar) get(t testing.TB, path string) int {
	t.Helper()
	resp, err := http.Get("http://" + s.metricsAddr + path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func runBinary(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cmd := exec.CommandContext(ctx, reloadBin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{nil, nil, "--process is required"},
		{[]string{"--process", "x"}, nil, "nothing to watch"},
		{[]string{"--process", "x", "--watch", "/tmp", "--signal", "BOGUS"}, nil, `--signal "BOGUS"`},
		{[]string{"--process", "x", "--watch", "/tmp", "--check-cmd", `nginx "-t`}, nil, "unterminated"},
		{[]string{"--process", "x", "--configmap", "noslash", "--write-dir", "/tmp/x"}, nil, "use namespace/name"},
		{[]string{"--watch", "/tmp"}, []string{"PS_DEBOUNCE=soon"}, "PS_DEBOUNCE"},
		{[]string{"--no-such-flag"}, nil, "unknown flag: --no-such-flag"},
		{[]string{"--process", "x", "--watch", "/tmp", "extra"}, nil, "unexpected arguments"},
	} {
		code, out := runBinary(t, tc.env, tc.args...)
		if code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("%q %q: exit %d, output %q; want exit 2 and %q", tc.env, tc.args, code, out, tc.want)
		}
	}
}

func TestFlagsFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	name := fmt.Sprintf("cache-aware-router-env-%d", os.Getpid())
	cart := reloadtest.StartHUPCounter(t, name)
	// Every flag also comes from PS_<FLAG>; the command line wins.
	s := &sidecar{log: &testbin.SyncBuffer{}}
	s.cmd = exec.Command(reloadBin, "--log-level=debug")
	s.cmd.Env = append(os.Environ(), "PS_WATCH="+dir, "PS_PROCESS="+name, "PS_METRICS_ADDR=127.0.0.1:0", "PS_LOG_LEVEL=error", "PS_DEBOUNCE=100ms")
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.cmd.Process.Signal(syscall.SIGTERM); s.cmd.Wait() })
	s.waitCount(t, 1, "msg=watching", "debounce=100ms")
	reloadtest.KubeletSwap(t, dir, map[string]string{"config.yaml": "workers: []\n"})
	s.waitCount(t, 1, "result=signalled")
	testbin.WaitFor(t, wait, "the HUP", func() bool { return cart.Count() == 1 })
}

func TestSelfMatchIsImpossible(t *testing.T) {
	dir := t.TempDir()
	// --process is the sidecar's own argv[0] (equal and basename rules),
	// and its own arguments contain the string too.
	s := startSidecar(t, "--watch", dir, "--process", reloadBin)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", s.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if argv0, _, _ := strings.Cut(string(b), "\x00"); argv0 != reloadBin {
		t.Fatalf("the sidecar's argv[0] is %q, not %q: the test would prove nothing", argv0, reloadBin)
	}
	reloadtest.KubeletSwap(t, dir, map[string]string{"a.conf": "x"})
	s.waitCount(t, 1, "result=no_process")
	if n := s.count("result=signalled") + s.count("result=success") + s.count("result=failed"); n != 0 {
		t.Fatalf("the sidecar signalled something (itself?): %d", n)
	}
	if v := s.metric(t, `autoconfig_reload_reloads_total{result="no_process"}`); v != 1 {
		t.Fatalf("no_process count %v, want 1", v)
	}
}

func TestCARTLikeTargetIsSignalledUnverified(t *testing.T) {
	dir := t.TempDir()
	reloadtest.KubeletSwap(t, dir, map[string]string{"config.yaml": "workers:\n- url: http://10.0.0.1:8000\n"})
	name := fmt.Sprintf("cache-aware-router-%d", os.Getpid())
	cart := reloadtest.StartHUPCounter(t, name)
	s := startSidecar(t, "--watch", dir, "--process", name)
	for i := 2; i <= 4; i++ {
		reloadtest.KubeletSwap(t, dir, map[string]string{"config.yaml": fmt.Sprintf("workers:\n- url: http://10.0.0.%d:8000\n", i)})
		s.waitCount(t, i-1, "result=signalled", fmt.Sprintf("pid=%d", cart.PID()))
		testbin.WaitFor(t, wait, "the HUP", func() bool { return cart.Count() >= i-1 })
		if n := cart.Count(); n != i-1 {
			t.Fatalf("after %d swaps: %d HUPs", i-1, n)
		}
	}
	if v := s.metric(t, `autoconfig_reload_reloads_total{result="signalled"}`); v != 3 {
		t.Fatalf("signalled count %v, want 3", v)
	}
	if v := s.metric(t, `autoconfig_reload_last_reload_success_timestamp_seconds`); v == 0 {
		t.Fatal("last success timestamp not set")
	}
}
