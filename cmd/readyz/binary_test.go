package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/readiness"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

// TestMain removes the binary built for the process tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// buildBinary builds the real readyz binary once per test run.
func buildBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "readyz-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binDir = dir
		binPath, buildErr = testbin.Build(dir, "readyz")
	})
	if buildErr != nil {
		t.Fatalf("building readyz: %v", buildErr)
	}
	return binPath
}

// proc is a running readyz.
type proc struct {
	cmd    *exec.Cmd
	addr   string
	mu     sync.Mutex
	lines  []map[string]any
	raw    strings.Builder
	exited chan error
}

// startBinary runs readyz with JSON logs and waits for its "listening"
// line to learn the address (it listens on 127.0.0.1:0, so there is no
// free-port race for the HTTP side either).
func startBinary(t *testing.T, args []string, env ...string) *proc {
	t.Helper()
	bin := buildBinary(t)
	args = append([]string{"--listen", "127.0.0.1:0", "--log-format", "json", "--cache-ttl", "50ms"}, args...)
	p := &proc{cmd: exec.Command(bin, args...), exited: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), env...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			line := sc.Text()
			p.mu.Lock()
			p.raw.WriteString(line + "\n")
			if json.Unmarshal([]byte(line), &m) == nil {
				p.lines = append(p.lines, m)
				if m["msg"] == "listening" {
					addr <- m["addr"].(string)
				}
			}
			p.mu.Unlock()
		}
		p.exited <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
		}
	})
	select {
	case p.addr = <-addr:
	case err := <-p.exited:
		t.Fatalf("readyz exited before listening: %v\n%s", err, p.log())
	case <-time.After(30 * time.Second):
		t.Fatalf("readyz did not log its address\n%s", p.log())
	}
	return p
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.raw.String()
}

func (p *proc) count(msg string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.lines {
		if l["msg"] == msg {
			n++
		}
	}
	return n
}

// get fetches path from the process.
func (p *proc) get(t *testing.T, path string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + p.addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// scans reads autoconfig_readyz_scans_total from /metrics.
func (p *proc) scans(t *testing.T) int {
	t.Helper()
	_, body := p.get(t, "/metrics")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, "autoconfig_readyz_scans_total "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("scans_total %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatalf("no autoconfig_readyz_scans_total in /metrics:\n%s", body)
	return 0
}

// waitStatus polls path until it answers code, failing at the deadline.
func (p *proc) waitStatus(t *testing.T, path string, code int) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, body := p.get(t, path)
		if got == code {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s stayed %d %s, want %d\n%s", path, got, body, code, p.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends SIGTERM and expects a clean exit.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		if err != nil {
			t.Errorf("readyz exit after SIGTERM: %v\n%s", err, p.log())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("readyz did not exit after SIGTERM\n%s", p.log())
	}
}

// TestBinaryFailOpenOnFixture runs the real binary on a fixture whose tcp
// table is unreadable: /readyz fails open and both warnings are logged
// once.
func TestBinaryFailOpenOnFixture(t *testing.T) {
	p := startBinary(t, []string{"--proc-root", fixture("unreadable-tcp"), "--readiness-required-listener=15008"})
	// Keep asking until several scans (50ms TTL) have seen the broken
	// table, so "logged once" means once across rescans.
	deadline := time.Now().Add(15 * time.Second)
	for p.scans(t) < 3 {
		if code, body := p.get(t, "/readyz"); code != 200 || body != `{"status":"ready"}` {
			t.Fatalf("GET /readyz = %d %s, want 200 ready", code, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than 3 scans before the deadline\n%s", p.log())
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.stop(t)
	if p.count(readiness.MsgTableUnreadable) != 1 || p.count(readiness.MsgNotEnforced) != 1 || p.count(readiness.MsgPresent) != 0 {
		t.Errorf("want one %q and one %q, no %q:\n%s", readiness.MsgTableUnreadable, readiness.MsgNotEnforced, readiness.MsgPresent, p.log())
	}
}

func TestBinaryUsageErrorExit2(t *testing.T) {
	bin := buildBinary(t)
	for _, args := range [][]string{
		{"--readiness-required-listener=0"},
		{"--readiness-required-listener=80", "--readiness-required-listener=80"},
		{"--bogus"},
	} {
		cmd := exec.Command(bin, args...)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Errorf("%v: exit %v, want 2\n%s", args, err, out)
		}
	}
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "PS_READINESS_REQUIRED_LISTENERS=1,70000")
	if out, err := cmd.CombinedOutput(); !strings.Contains(string(out), "70000") {
		t.Errorf("bad env port: %v\n%s", err, out)
	}
}

func fixture(name string) string { return filepath.Join("..", "..", "testdata", "proc", name) }
