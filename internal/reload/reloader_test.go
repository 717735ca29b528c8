package reload

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/reload/reloadtest"
	"github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

func TestMain(m *testing.M) {
	reloadtest.MaybeRunHUPCounter()
	os.Exit(m.Run())
}

// wait bounds every condition wait of these tests; nothing here is a
// timing assertion, only a guard against hanging.
const wait = 20 * time.Second

var nameSeq atomic.Int64

// uniqueName is an argv[0] no other process on the machine has, so tests
// running beside other packages' processes match exactly one process.
func uniqueName(base string) string {
	return fmt.Sprintf("%s-%d-%d", base, os.Getpid(), nameSeq.Add(1))
}

// harness runs a Reloader in the background and records what it does.
type harness struct {
	r        *Reloader
	outcomes testbin.Recorder[Outcome]
	settles  testbin.Recorder[bool]
}

// startReloader builds a Reloader from o (New), lets each of set replace
// what the binary would build (a Source, a report, a seam), and runs it
// until the test ends.
func startReloader(t *testing.T, o Options, set ...func(*Reloader)) *harness {
	t.Helper()
	r, err := New(o, slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range set {
		f(r)
	}
	h := &harness{r: r}
	r.sig.onReload = h.outcomes.Add
	r.onSettle = h.settles.Add
	testbin.Run(t, "reloader", r.Run, r.Started())
	return h
}

// apiMode makes r take its content from src, written into dir (one of its
// watched directories), as New does with a ConfigMapSync for --configmap
// and --write-dir.
func apiMode(src Source, dir string) func(*Reloader) {
	return func(r *Reloader) { setSource(r, src, dir) }
}

// reportTo gives r's served reports to f, as New does to a PodReporter for
// --pod-name.
func reportTo(f func(served.Report)) func(*Reloader) {
	return func(r *Reloader) { r.report = f }
}

func (h *harness) Outcomes() []Outcome { return h.outcomes.Get() }

func (h *harness) Settles() []bool { return h.settles.Get() }

// waitOutcomeFor waits for the attempt made for dirs' current content.
func (h *harness) waitOutcomeFor(t *testing.T, dirs ...string) Outcome {
	t.Helper()
	fp, err := Fingerprint(dirs)
	if err != nil {
		t.Fatal(err)
	}
	var got Outcome
	testbin.WaitFor(t, wait, "a reload attempt for the current content", func() bool {
		for _, o := range h.Outcomes() {
			if o.Fingerprint == fp {
				got = o
				return true
			}
		}
		return false
	})
	return got
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func routeFiles(version int) map[string]string {
	return map[string]string{
		"config.yaml": fmt.Sprintf("workers:\n- url: http://10.0.0.%d:8000\n", version),
		"other.conf":  "static\n",
	}
}

func TestKubeletSwapsGiveOneHUPEach(t *testing.T) {
	dir := t.TempDir()
	reloadtest.KubeletSwap(t, dir, routeFiles(0))
	name := uniqueName("cache-aware-router")
	cart := reloadtest.StartHUPCounter(t, name)
	h := startReloader(t, Options{WatchDirs: []string{dir}, Process: name})

	for i := 1; i <= 3; i++ {
		reloadtest.KubeletSwap(t, dir, routeFiles(i))
		o := h.waitOutcomeFor(t, dir)
		if o.Result != ResultSignalled || o.PID != cart.PID() {
			t.Fatalf("swap %d: got %+v, want signalled to %d", i, o, cart.PID())
		}
		testbin.WaitFor(t, wait, "the HUP to arrive", func() bool { return cart.Count() >= i })
		if n := cart.Count(); n != i {
			t.Fatalf("after swap %d: %d HUPs, want %d", i, n, i)
		}
	}
	if n := len(h.Outcomes()); n != 3 {
		t.Fatalf("%d reload attempts for 3 swaps: %+v", n, h.Outcomes())
	}
}

func TestBurstIsCoalesced(t *testing.T) {
	dir := t.TempDir()
	reloadtest.KubeletSwap(t, dir, routeFiles(0))
	name := uniqueName("cache-aware-router")
	cart := reloadtest.StartHUPCounter(t, name)
	h := startReloader(t, Options{WatchDirs: []string{dir}, Process: name})

	// 20 swaps spread over about 100 ms.
	for i := 1; i <= 20; i++ {
		reloadtest.KubeletSwap(t, dir, routeFiles(i))
		time.Sleep(5 * time.Millisecond)
	}
	h.waitOutcomeFor(t, dir)
	testbin.WaitFor(t, wait, "a HUP", func() bool { return cart.Count() >= len(h.Outcomes()) })
	if n := cart.Count(); n < 1 || n > 2 {
		t.Fatalf("20 swaps in 100 ms gave %d HUPs, want 1 or 2", n)
	}
	t.Logf("20 swaps → %d HUP(s)", cart.Count())
}

func TestNoVisibleChangeNoReload(t *testing.T) {
	dir := t.TempDir()
	reloadtest.KubeletSwap(t, dir, routeFiles(1))
	name := uniqueName("cache-aware-router")
	cart := reloadtest.StartHUPCounter(t, name)
	h := startReloader(t, Options{WatchDirs: []string{dir}, Process: name})

	// A swap to identical content (kubelet resync after a no-op update).
	reloadtest.KubeletSwap(t, dir, routeFiles(1))
	testbin.WaitFor(t, wait, "the directories to settle", func() bool { return len(h.Settles()) >= 1 })
	if s := h.Settles(); s[0] {
		t.Fatalf("identical swap counted as a change: %v", s)
	}
	// Plain (non-kubelet) writes are changes too.
	if err := os.WriteFile(filepath.Join(dir, "plain.conf"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.waitOutcomeFor(t, dir)
	testbin.WaitFor(t, wait, "the HUP", func() bool { return cart.Count() >= 1 })
	if n := cart.Count(); n != 1 {
		t.Fatalf("%d HUPs, want 1", n)
	}
}

// TestNoProcessIsRetriedWithoutAChange: a change seen while the target is
// not running used to be forgotten until the next change (its fingerprint
// was recorded before the attempt). It is retried with backoff, so the
// target is signalled once it runs, with no further change.
func TestNoProcessIsRetriedWithoutAChange(t *testing.T) {
	dir := t.TempDir()
	name := uniqueName("cache-aware-router")
	h := startReloader(t, Options{WatchDirs: []string{dir}, Process: name, RetryMax: time.Second})

	reloadtest.KubeletSwap(t, dir, routeFiles(1))
	if o := h.waitOutcomeFor(t, dir); o.Result != ResultNoProcess {
		t.Fatalf("got %+v, want no_process", o)
	}
	cart := reloadtest.StartHUPCounter(t, name)
	testbin.WaitFor(t, wait, "the retried HUP", func() bool { return cart.Count() == 1 })
	if v := counterValue(t, h.r.metrics, ResultNoProcess); v < 1 {
		t.Fatalf("reloads_total{result=no_process} = %v, want at least 1", v)
	}
	// The HUP can arrive before the attempt's outcome is recorded (the
	// outcome is reported after the signal): wait for it.
	var last Outcome
	testbin.WaitFor(t, wait, "the signalled attempt to be recorded", func() bool {
		o := h.Outcomes()
		last = o[len(o)-1]
		return last.Result != ResultNoProcess
	})
	if last.Result != ResultSignalled || last.PID != cart.PID() {
		t.Fatalf("last attempt %+v, want signalled to %d", last, cart.PID())
	}
}

// TestUnreadableDirectoriesAreRetried: a failed read of the directories
// (injected: the first three snapshots after the change fail) is retried
// until it succeeds, with no further change.
func TestUnreadableDirectoriesAreRetried(t *testing.T) {
	dir := t.TempDir()
	name := uniqueName("cache-aware-router")
	cart := reloadtest.StartHUPCounter(t, name)
	var calls, failed atomic.Int32
	h := startReloader(t, Options{WatchDirs: []string{dir}, Process: name, RetryMax: time.Second}, func(r *Reloader) {
		r.snapshot = func(dirs []string) (Snapshot, error) {
			if calls.Add(1) > 1 && failed.Load() < 3 { // the first call is the startup read
				failed.Add(1)
				return Snapshot{}, fmt.Errorf("injected read failure %d", failed.Load())
			}
			return TakeSnapshot(dirs)
		}
	})
	reloadtest.KubeletSwap(t, dir, routeFiles(1))
	h.waitOutcomeFor(t, dir)
	testbin.WaitFor(t, wait, "the HUP", func() bool { return cart.Count() == 1 })
	if failed.Load() != 3 {
		t.Fatalf("%d injected failures, want 3", failed.Load())
	}
	if v := counterValue(t, h.r.metrics, ResultError); v != 3 {
		t.Fatalf("reloads_total{result=error} = %v, want 3", v)
	}
}

// TestRefusedContentIsCheckedAgainAtResync: a check that fails for a
// reason outside the content (here a flag file; in life a timeout under
// load) is tried again at the resync tick, so the content is loaded once
// the cause is gone, without a further change.
func TestRefusedContentIsCheckedAgainAtResync(t *testing.T) {
	dir := t.TempDir()
	flag := filepath.Join(t.TempDir(), "busy")
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	name := uniqueName("cache-aware-router")
	cart := reloadtest.StartHUPCounter(t, name)
	h := startReloader(t, Options{WatchDirs: []string{dir}, Process: name, Resync: 300 * time.Millisecond,
		CheckCmd: reloadtest.CommandLine("bash", "-c", `[ ! -e "$0" ] || { echo "check: busy"; exit 1; }`, flag)})

	reloadtest.KubeletSwap(t, dir, routeFiles(1))
	if o := h.waitOutcomeFor(t, dir); o.Result != ResultCheckFailed {
		t.Fatalf("got %+v, want check_failed", o)
	}
	if err := os.Remove(flag); err != nil {
		t.Fatal(err)
	}
	testbin.WaitFor(t, wait, "the HUP after the resync", func() bool { return cart.Count() == 1 })
}

// TestResyncCatchesALostEvent: a change the watcher did not report (the
// watch is removed here, as an overflow or a lost inotify event would) is
// still loaded at the next resync tick.
func TestResyncCatchesALostEvent(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "routes")
	other := filepath.Join(parent, "other")
	for _, d := range []string{dir, other} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	name := uniqueName("cache-aware-router")
	cart := reloadtest.StartHUPCounter(t, name)
	// The content is read through a symlink the watcher does not follow:
	// writes behind it produce no event in the watched directory.
	if err := os.Symlink(filepath.Join(other, "config.yaml"), filepath.Join(dir, "config.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "config.yaml"), []byte("v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := startReloader(t, Options{WatchDirs: []string{dir}, Process: name, Resync: 300 * time.Millisecond})
	if err := os.WriteFile(filepath.Join(other, "config.yaml"), []byte("v2"), 0o644); err != nil {
		t.Fatal(err)
	}
	testbin.WaitFor(t, wait, "the HUP after the resync", func() bool { return cart.Count() == 1 })
	if o := h.waitOutcomeFor(t, dir); o.Result != ResultSignalled {
		t.Fatalf("got %+v, want signalled", o)
	}
}

func TestAmbiguousMatchSignalsNobody(t *testing.T) {
	dir := t.TempDir()
	name := uniqueName("cache-aware-router")
	a := reloadtest.StartHUPCounter(t, name)
	b := reloadtest.StartHUPCounter(t, name)
	h := startReloader(t, Options{WatchDirs: []string{dir}, Process: name})

	reloadtest.KubeletSwap(t, dir, routeFiles(1))
	o := h.waitOutcomeFor(t, dir)
	if o.Result != ResultAmbiguous || !strings.Contains(o.Err.Error(), fmt.Sprint(a.PID())) || !strings.Contains(o.Err.Error(), fmt.Sprint(b.PID())) {
		t.Fatalf("got %+v, want ambiguous naming both pids", o)
	}
	if a.Count()+b.Count() != 0 {
		t.Fatal("a process was signalled despite an ambiguous match")
	}
}

func TestFailingCheckDoesNotSignal(t *testing.T) {
	dir := t.TempDir()
	name := uniqueName("cache-aware-router")
	cart := reloadtest.StartHUPCounter(t, name)
	h := startReloader(t, Options{WatchDirs: []string{dir}, Process: name,
		CheckCmd: reloadtest.CommandLine("bash", "-c", `grep -q broken "$0"/config.yaml && { echo "config.yaml: broken workers"; exit 1; }; exit 0`, dir)})

	reloadtest.KubeletSwap(t, dir, map[string]string{"config.yaml": "workers: broken\n"})
	o := h.waitOutcomeFor(t, dir)
	if o.Result != ResultCheckFailed || !strings.Contains(o.Err.Error(), "config.yaml: broken workers") {
		t.Fatalf("got %+v, want check_failed with the command's output", o)
	}
	reloadtest.KubeletSwap(t, dir, routeFiles(1))
	if o := h.waitOutcomeFor(t, dir); o.Result != ResultSignalled {
		t.Fatalf("good config: got %+v, want signalled", o)
	}
	testbin.WaitFor(t, wait, "the HUP", func() bool { return cart.Count() >= 1 })
	if n := cart.Count(); n != 1 {
		t.Fatalf("%d HUPs, want exactly 1 (only the good config)", n)
	}
}
