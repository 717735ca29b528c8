package reload

import (
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/reload/reloadtest"
	"github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// TestServedReportFollowsWhatTheTargetLoaded: the report names, per key,
// the ID of the bytes the target was signalled with — the content present
// at start, then each signalled content — and nothing for a content no
// process received.
func TestServedReportFollowsWhatTheTargetLoaded(t *testing.T) {
	dir := t.TempDir()
	reloadtest.KubeletSwap(t, dir, routeFiles(0))
	name := uniqueName("cache-aware-router")
	var rep testbin.Recorder[served.Report]
	h := startReloader(t, Options{WatchDirs: []string{dir}, Process: name, RetryMax: time.Second}, reportTo(rep.Add))

	first := rep.Get()
	if len(first) != 1 || first[0].How != served.HowStart || first[0].Keys["config.yaml"] != served.ID([]byte(routeFiles(0)["config.yaml"])) || len(first[0].Keys) != 2 {
		t.Fatalf("at start: %+v, want the start content's two keys", first)
	}

	// No target: nothing is served, nothing reported.
	reloadtest.KubeletSwap(t, dir, routeFiles(1))
	if o := h.waitOutcomeFor(t, dir); o.Result != ResultNoProcess {
		t.Fatalf("got %+v, want no_process", o)
	}
	if n := len(rep.Get()); n != 1 {
		t.Fatalf("%d reports after a content no process received, want 1: %+v", n, rep.Get())
	}

	// The target appears and is signalled (a CART-like process has no
	// workers, so the reload is "signal", not verified).
	cart := reloadtest.StartHUPCounter(t, name)
	testbin.WaitFor(t, wait, "the HUP", func() bool { return cart.Count() == 1 })
	testbin.WaitFor(t, wait, "the report", func() bool { return len(rep.Get()) == 2 })
	last := rep.Get()[1]
	if last.How != served.HowSignal || last.Keys["config.yaml"] != served.ID([]byte(routeFiles(1)["config.yaml"])) || last.Keys["other.conf"] != served.ID([]byte("static\n")) {
		t.Fatalf("after the signal: %+v, want version 1 signalled", last)
	}
	if last.At.IsZero() {
		t.Fatal("the report has no time")
	}
}
