package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/reload"
	"github.com/modelsphere/autoconfig/internal/reload/reloadtest"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// witness is the real kill(2), recording what the watched directory held
// when the signal was sent: the "..data" target is read right before and
// right after the kill, and the route file of that target right before.
// A target that changed in between is counted as undecided, not as bad;
// so is bad content that arrived after the Reloader's last look (the
// content id it found in place right before signalling, OnVerified): no
// sidecar can close that window of microseconds, and nginx's own load
// refuses what arrived in it. Bad content the Reloader signalled without
// a last look, or whose id it found in place, is bad.
type witness struct {
	dir, file string
	mu        sync.Mutex
	verified  string // the content id of the Reloader's last look ("" = none)
	good, bad int
	undecided int
	late      int // of undecided: bad content swapped in after the last look
}

// Verified records the Reloader's last look before a signal.
func (w *witness) Verified(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.verified = id
}

func (w *witness) Signal(pid int, sig syscall.Signal) error {
	t0, _ := os.Readlink(filepath.Join(w.dir, "..data"))
	content, rerr := os.ReadFile(filepath.Join(w.dir, t0, w.file))
	err := syscall.Kill(pid, sig)
	t1, _ := os.Readlink(filepath.Join(w.dir, "..data"))
	w.mu.Lock()
	defer w.mu.Unlock()
	looked := w.verified
	w.verified = ""
	switch {
	case t0 != t1 || rerr != nil:
		w.undecided++
	case strings.Contains(string(content), "no_such_directive") && looked != "" && looked != "data:"+t0:
		w.undecided++
		w.late++
	case strings.Contains(string(content), "no_such_directive"):
		w.bad++
	default:
		w.good++
	}
	return err
}

func (w *witness) counts() (good, bad, undecided int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.good, w.bad, w.undecided
}

// TestSwapRaceNeverSignalsUncheckedContent: "..data" is swapped between a
// good and a bad version (bad = refused by nginx -t) at intervals from 0
// to 300 ms while the sidecar checks and signals a real nginx. The check
// must be bound to the content that is then signalled: no SIGHUP may be
// sent while bad content is in place. Before the content identity was
// re-read right before the signal, a swap during the check (nginx -t takes
// tens of milliseconds) led to signalling content nobody had checked.
func TestSwapRaceNeverSignalsUncheckedContent(t *testing.T) {
	dir := t.TempDir()
	n := nginxtest.Start(t, nginxtest.Options{RoutesDir: dir})
	file := "session_route_a.conf"
	good := func(i int) map[string]string {
		return map[string]string{file: fmt.Sprintf("server {\n    listen unix:%s;\n    location / { return 200 \"g%d\\n\"; }\n}\n", n.SockPath("a"), i)}
	}
	bad := map[string]string{file: fmt.Sprintf("server {\n    listen unix:%s;\n    no_such_directive on;\n}\n", n.SockPath("a"))}
	reloadtest.KubeletSwap(t, dir, good(0))
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	w := &witness{dir: dir, file: file}
	// nginx -t reads this one small file in a few milliseconds; on a
	// shared nginx with 300 routes it takes about 160 ms. The sleep after
	// the real check gives it that length.
	check := append([]string{"bash", "-c", `"$@" && sleep 0.15`, "check"}, n.TestCommand()...)
	h := runReloader(t, reload.Options{WatchDirs: []string{dir}, Process: n.MasterMatch(), CheckCmd: reloadtest.CommandLine(check...),
		Debounce: 20 * time.Millisecond, MaxDelay: 100 * time.Millisecond}, w)

	intervals := []time.Duration{0, 10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}
	const perInterval = 34 // 204 swaps
	swaps := 0
	// A loaded machine (nginx -t and the signal slowed by other tests)
	// signals fewer times per round: the rounds go on, at most 3, until
	// the race was exercised (5 signals).
	for round := 0; round < 3; round++ {
		if g, b, u := w.counts(); round > 0 && g+b+u >= 5 {
			break
		}
		for _, iv := range intervals {
			for j := 0; j < perInterval; j++ {
				swaps++
				if swaps%2 == 0 {
					reloadtest.KubeletSwap(t, dir, good(swaps))
				} else {
					reloadtest.KubeletSwap(t, dir, bad)
				}
				time.Sleep(iv)
			}
		}
	}
	// End on good content: it must be served.
	swaps++
	reloadtest.KubeletSwap(t, dir, good(swaps))
	testbin.WaitFor(t, wait, "the last good version to be served", func() bool {
		_, body := nginxtest.Get(t, n.URL("a"))
		return body == fmt.Sprintf("g%d\n", swaps)
	})
	g, b, u := w.counts()
	results := map[string]int{}
	for _, o := range h.outcomes() {
		results[o.Result]++
	}
	t.Logf("%d swaps at intervals %v: %d signals with checked good content in place, %d with bad content, %d undecided (%d of them bad content swapped in after the last look); attempts by result %v",
		swaps, intervals, g, b, u, w.late, results)
	if b != 0 {
		t.Errorf("%d SIGHUPs were sent while content refused by the check was in place", b)
	}
	if g+b+u < 5 {
		t.Errorf("only %d signals over %d swaps: the race was not exercised", g+b+u, swaps)
	}
}

// inProcess is a Reloader run in the test process (to wrap its Signaller
// or inject failures), recording its outcomes.
type inProcess struct {
	out testbin.Recorder[reload.Outcome]
}

func (p *inProcess) outcomes() []reload.Outcome { return p.out.Get() }

// runReloader runs the Reloader New builds from o, its signals sent through
// sig (reload.TestHooks), until the test ends.
func runReloader(t *testing.T, o reload.Options, sig reload.Signaller) *inProcess {
	t.Helper()
	p := &inProcess{}
	sink := &testbin.SyncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("reloader log:\n%s", sink.String())
		}
	})
	r, err := reload.New(o, slog.New(slog.NewTextHandler(sink, &slog.HandlerOptions{Level: slog.LevelDebug})), nil)
	if err != nil {
		t.Fatal(err)
	}
	hooks := reload.TestHooks{
		Signaller: sig,
		OnReload:  p.out.Add,
	}
	if v, ok := sig.(interface{ Verified(string) }); ok {
		hooks.OnVerified = v.Verified
	}
	r.SetTestHooks(hooks)
	testbin.Run(t, "reloader", r.Run, r.Started())
	return p
}
