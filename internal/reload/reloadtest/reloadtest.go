// Package reloadtest holds the reload sidecar's test fixtures: a kubelet
// style ConfigMap volume updater, a real process that counts SIGHUPs
// under any argv[0], and peers tables with the engine's view of them.
// The helpers any test uses (waiting, Must, the module root) are
// internal/testbin's.
//
// A test binary using StartHUPCounter must call MaybeRunHUPCounter first
// thing in TestMain: the counter is the test binary itself, re-executed
// through "bash -c 'exec -a <argv0> …'" so its argv[0] is what a process
// matcher sees in /proc/<pid>/cmdline.
package reloadtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/peers"
)

// KubeletSwap updates dir the way kubelet's AtomicWriter updates a
// ConfigMap volume, step by step: a new "..<timestamp>" directory with the
// files, a "..data_tmp" symlink to it renamed over "..data", per-key
// symlinks "<key>" -> "..data/<key>" for new keys, removal of the links of
// keys that disappeared, removal of the old timestamped directory. It is
// written independently of reload.WriteAtomic on purpose: the tests check
// the sidecar against kubelet's behaviour, not against itself.
func KubeletSwap(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	if err := kubeletSwap(dir, files); err != nil {
		t.Fatalf("kubelet swap in %s: %v", dir, err)
	}
}

var swapSeq atomic.Int64

func kubeletSwap(dir string, files map[string]string) error {
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	ts := fmt.Sprintf("..%s.%d", time.Now().UTC().Format("2006_01_02_15_04_05"), swapSeq.Add(1))
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		return err
	}
	for k, v := range files {
		if err := os.WriteFile(filepath.Join(dir, ts, k), []byte(v), 0o644); err != nil {
			return err
		}
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data_tmp")); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		return err
	}
	for k := range files {
		p := filepath.Join(dir, k)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", k), p); err != nil {
			return err
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if _, keep := files[e.Name()]; keep || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	if old != "" {
		return os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}

const (
	envFile  = "RELOADTEST_HUP_FILE"
	envReady = "RELOADTEST_READY_FILE"
)

// MaybeRunHUPCounter turns the process into a SIGHUP counter and never
// returns when the test binary was started by StartHUPCounter. Each SIGHUP
// appends its arrival time (Unix nanoseconds) as a line to the file.
func MaybeRunHUPCounter() {
	file := os.Getenv(envFile)
	if file == "" {
		return
	}
	hup := make(chan os.Signal, 64)
	signal.Notify(hup, syscall.SIGHUP)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	f, err := os.OpenFile(file, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.WriteFile(os.Getenv(envReady), []byte("ready"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for {
		select {
		case <-hup:
			fmt.Fprintf(f, "%d\n", time.Now().UnixNano())
		case <-term:
			f.Close()
			os.Exit(0)
		}
	}
}

// HUPCounter is a running process that counts the SIGHUPs it receives.
type HUPCounter struct {
	cmd  *exec.Cmd
	file string
}

// StartHUPCounter starts the counter with the given argv[0] (through
// bash's "exec -a") and waits until it handles SIGHUP. It is stopped by
// t.Cleanup.
func StartHUPCounter(t testing.TB, argv0 string) *HUPCounter {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := &HUPCounter{file: filepath.Join(dir, "hups")}
	ready := filepath.Join(dir, "ready")
	c.cmd = exec.Command("bash", "-c", `exec -a "$0" "$1"`, argv0, self)
	c.cmd.Env = append(os.Environ(), envFile+"="+c.file, envReady+"="+ready)
	c.cmd.Stderr = os.Stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start HUP counter: %v", err)
	}
	t.Cleanup(c.Stop)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("HUP counter %q did not become ready", argv0)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Stop ends the counter (SIGTERM) and waits for it.
func (c *HUPCounter) Stop() {
	c.cmd.Process.Signal(syscall.SIGTERM)
	c.cmd.Wait()
}

// PID is the counter's pid.
func (c *HUPCounter) PID() int { return c.cmd.Process.Pid }

// Times returns the arrival times of the SIGHUPs so far.
func (c *HUPCounter) Times() []time.Time {
	b, _ := os.ReadFile(c.file)
	var ts []time.Time
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if n, err := strconv.ParseInt(l, 10, 64); err == nil {
			ts = append(ts, time.Unix(0, n))
		}
	}
	return ts
}

// Count is the number of SIGHUPs received so far.
func (c *HUPCounter) Count() int { return len(c.Times()) }

// CommandLine is the --check-cmd value that runs args as they are: each is
// single-quoted, so the sidecar's split (reload.SplitCommand: quotes group,
// adjacent quoted parts join) gives args back. A single quote in an
// argument is written as '"'"'.
func CommandLine(args ...string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'"'"'`) + "'"
	}
	return strings.Join(q, " ")
}

// PeersTable is the content of route's peers table, one tier of ips (port
// 8000), and its version.
func PeersTable(t testing.TB, route string, ips ...string) (content, version string) {
	t.Helper()
	tab := peers.Table{Route: route, Tiers: []peers.Tier{{Use: "backend", Priority: 1}}}
	for _, ip := range ips {
		tab.Tiers[0].Peers = append(tab.Tiers[0].Peers, peers.Peer{Host: ip, Port: 8000})
	}
	b, err := tab.Encode()
	if err != nil {
		t.Fatal(err)
	}
	p, err := peers.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), p.Version
}

// EngineVersion is the version of the table the engine holds for route
// ("" = none, or no such route), asked over c, a client of the engine's
// control socket.
func EngineVersion(c *http.Client, route string) string {
	resp, err := c.Get("http://engine/peers/" + route)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var a struct {
		Version string `json:"version"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&a) != nil {
		return ""
	}
	return a.Version
}
