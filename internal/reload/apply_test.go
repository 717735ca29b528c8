package reload

import (
	"context"
	"log/slog"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/reload/reloadtest"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// staticSource is a Source whose content the test sets.
type staticSource struct {
	mu      sync.Mutex
	files   map[string][]byte
	ch      chan struct{}
	applied int
}

func newStaticSource() *staticSource { return &staticSource{ch: make(chan struct{}, 1)} }

func (s *staticSource) set(files map[string]string) {
	s.mu.Lock()
	s.files = map[string][]byte{}
	for k, v := range files {
		s.files[k] = []byte(v)
	}
	s.mu.Unlock()
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

func (s *staticSource) Desired() (map[string][]byte, string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.files), ContentVersion(s.files), s.files != nil
}
func (s *staticSource) Changed() <-chan struct{} { return s.ch }
func (s *staticSource) Applied()                 { s.mu.Lock(); s.applied++; s.mu.Unlock() }

// TestQuarantineSearchIsBounded: the check refuses any file containing
// "broken". Of five changed keys two are broken: both are quarantined
// with their last good version on disk (or absent, for a new key), the
// three others are written and signalled, and the search costs at most
// one check per changed key plus the first.
func TestQuarantineSearchIsBounded(t *testing.T) {
	dir := t.TempDir()
	calls := filepath.Join(t.TempDir(), "calls")
	check := reloadtest.CommandLine("bash", "-c", `echo >> "$1"; for f in "$0"/*; do grep -q broken "$f" && { echo "broken in $f:1"; exit 1; }; done; exit 0`, dir, calls)
	name := uniqueName("cache-aware-router")
	cart := reloadtest.StartHUPCounter(t, name)
	src := newStaticSource()
	h := startReloader(t, Options{WatchDirs: []string{dir}, Process: name, CheckCmd: check}, apiMode(src, dir))

	src.set(map[string]string{"a.conf": "a1", "b.conf": "b1", "c.conf": "c1"})
	testbin.WaitFor(t, wait, "the first content", func() bool { return cart.Count() == 1 })
	os.Remove(calls)

	src.set(map[string]string{"a.conf": "a2", "b.conf": "broken", "c.conf": "c2", "d.conf": "d1", "e.conf": "broken too"})
	testbin.WaitFor(t, wait, "the second reload", func() bool { return cart.Count() == 2 })
	got, err := readFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a.conf": "a2", "b.conf": "b1", "c.conf": "c2", "d.conf": "d1"}
	if len(got) != len(want) {
		t.Fatalf("on disk %v, want %v", got, want)
	}
	for k, v := range want {
		if string(got[k]) != v {
			t.Fatalf("%s on disk %q, want %q", k, got[k], v)
		}
	}
	// The HUP can arrive before the attempt's outcome is recorded.
	var last Outcome
	testbin.WaitFor(t, wait, "the second reload's outcome", func() bool {
		n := 0
		for _, o := range h.Outcomes() {
			if o.Result == ResultSignalled {
				n++
				last = o
			}
		}
		return n >= 2
	})
	if strings.Join(last.Quarantined, ",") != "b.conf,e.conf" {
		t.Fatalf("quarantined %v, want b.conf, e.conf", last.Quarantined)
	}
	if v := gaugeValue(t, h.r.metrics.QuarantinedKeys); v != 2 {
		t.Fatalf("quarantined_keys %v, want 2", v)
	}
	b, _ := os.ReadFile(calls)
	if n, changed := strings.Count(string(b), "\n"), 5; n > changed+1 {
		t.Fatalf("%d checks for %d changed keys, want at most %d", n, changed, changed+1)
	}

	// A later change of another key costs two checks: the rest together,
	// then the suspect alone; the quarantine holds.
	os.Remove(calls)
	src.set(map[string]string{"a.conf": "a3", "b.conf": "broken", "c.conf": "c2", "d.conf": "d1", "e.conf": "broken too"})
	testbin.WaitFor(t, wait, "the third reload", func() bool { return cart.Count() == 3 })
	if b, _ := os.ReadFile(calls); strings.Count(string(b), "\n") != 3 {
		t.Fatalf("%d checks with two suspects and one changed key, want 3", strings.Count(string(b), "\n"))
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "a.conf")); string(got) != "a3" {
		t.Fatalf("a.conf %q, want a3", got)
	}

	// Both fixed: released.
	src.set(map[string]string{"a.conf": "a3", "b.conf": "b2", "c.conf": "c2", "d.conf": "d1", "e.conf": "e1"})
	testbin.WaitFor(t, wait, "the fourth reload", func() bool { return cart.Count() == 4 })
	if v := gaugeValue(t, h.r.metrics.QuarantinedKeys); v != 0 {
		t.Fatalf("quarantined_keys %v after the fix, want 0", v)
	}
}

// TestCheckFailingWithoutTheChangeBlamesNoKey: when the last good content
// fails the check too (the check's environment broke), no key is
// quarantined and nothing is signalled.
func TestCheckFailingWithoutTheChangeBlamesNoKey(t *testing.T) {
	dir := t.TempDir()
	flag := filepath.Join(t.TempDir(), "broken-env")
	name := uniqueName("cache-aware-router")
	cart := reloadtest.StartHUPCounter(t, name)
	src := newStaticSource()
	h := startReloader(t, Options{WatchDirs: []string{dir}, Process: name,
		CheckCmd: reloadtest.CommandLine("bash", "-c", `[ ! -e "$0" ]`, flag)}, apiMode(src, dir))
	src.set(map[string]string{"a.conf": "a1"})
	testbin.WaitFor(t, wait, "the first content", func() bool { return cart.Count() == 1 })
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	src.set(map[string]string{"a.conf": "a2"})
	testbin.WaitFor(t, wait, "the refused check", func() bool { return counterValue(t, h.r.metrics, ResultCheckFailed) >= 1 })
	time.Sleep(300 * time.Millisecond) // would a signal follow? (none may)
	if cart.Count() != 1 || gaugeValue(t, h.r.metrics.QuarantinedKeys) != 0 {
		t.Fatalf("HUPs %d (want 1), quarantined %v (want 0)", cart.Count(), gaugeValue(t, h.r.metrics.QuarantinedKeys))
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "a.conf")); string(got) != "a1" {
		t.Fatalf("a.conf %q, want the last good a1", got)
	}
}

func TestFailingKeys(t *testing.T) {
	dir := t.TempDir()
	reloadtest.KubeletSwap(t, dir, map[string]string{"route_a.conf": "x", "xroute_a.conf": "y", "b.conf": "z"})
	out := `nginx: [emerg] unknown directive "foo" in /etc/nginx/routes/route_a.conf:3` + "\nnginx: configuration file test failed"
	if got := failingKeys(out, []string{dir}); strings.Join(got, ",") != "route_a.conf" {
		t.Fatalf("failingKeys = %v, want [route_a.conf]", got)
	}
	if got := failingKeys("no file named", []string{dir}); len(got) != 0 {
		t.Fatalf("failingKeys = %v, want none", got)
	}
}

// TestSnapshotIsPinnedToOneVersion: the identity names the "..data"
// target, and a later swap changes it even when the visible content is
// identical; the fingerprint follows the content only.
func TestSnapshotIsPinnedToOneVersion(t *testing.T) {
	dir := t.TempDir()
	reloadtest.KubeletSwap(t, dir, map[string]string{"a.conf": "1"})
	s1, err := TakeSnapshot([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := ContentID([]string{dir}); id != s1.ID || !strings.HasPrefix(id, "data:..") {
		t.Fatalf("ContentID %q, snapshot ID %q", id, s1.ID)
	}
	reloadtest.KubeletSwap(t, dir, map[string]string{"a.conf": "1"})
	s2, _ := TakeSnapshot([]string{dir})
	if s2.ID == s1.ID || s2.Fingerprint != s1.Fingerprint {
		t.Fatalf("identical swap: IDs %q %q (want different), fingerprints equal %v (want equal)", s1.ID, s2.ID, s2.Fingerprint == s1.Fingerprint)
	}
	// A plain directory is identified by its content.
	plain := t.TempDir()
	os.WriteFile(filepath.Join(plain, "a.conf"), []byte("1"), 0o644)
	p1, _ := ContentID([]string{plain})
	os.WriteFile(filepath.Join(plain, "a.conf"), []byte("2"), 0o644)
	if p2, _ := ContentID([]string{plain}); p2 == p1 || !strings.HasPrefix(p1, "hash:") {
		t.Fatalf("plain directory IDs %q, %q", p1, p2)
	}
}

// gaugeAtLog is a slog handler that records, for each record whose
// message starts with prefix, what the gauge read when it was logged.
type gaugeAtLog struct {
	t      *testing.T
	prefix string
	gauge  prometheus.Gauge
	seen   *[]float64
}

func (h gaugeAtLog) Enabled(context.Context, slog.Level) bool { return true }
func (h gaugeAtLog) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		*h.seen = append(*h.seen, gaugeValue(h.t, h.gauge))
	}
	return nil
}
func (h gaugeAtLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h gaugeAtLog) WithGroup(string) slog.Handler      { return h }

// TestQuarantineGaugeSetBeforeItsLogLine: whoever reads the "quarantined"
// or "released" line (an operator, an alert on the log, a test) finds
// autoconfig_reload_quarantined_keys already saying so.
func TestQuarantineGaugeSetBeforeItsLogLine(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	var entered, released []float64
	log := slog.New(slog.NewMultiHandler(
		gaugeAtLog{t, "quarantined:", m.QuarantinedKeys, &entered},
		gaugeAtLog{t, "released from quarantine", m.QuarantinedKeys, &released},
	))
	a := &applier{env: &env{log: log, metrics: m}}
	desired := map[string][]byte{"a.conf": []byte("broken"), "b.conf": []byte("broken")}
	a.setQuarantine(desired, map[string]quarantined{"a.conf": {hash: "1"}, "b.conf": {hash: "2"}})
	a.setQuarantine(desired, nil)
	if !slices.Equal(entered, []float64{2, 2}) || !slices.Equal(released, []float64{0, 0}) {
		t.Fatalf("gauge at the quarantined lines %v (want 2 2), at the released lines %v (want 0 0)", entered, released)
	}
}
