package readiness

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/testbin"
)

// countScans wraps the detector's real scan with a counter and an optional
// hook that runs before it.
func countScans(d *Detector, before func(n int64)) *atomic.Int64 {
	var n atomic.Int64
	real := d.scan
	d.scan = func() scanResult {
		i := n.Add(1)
		if before != nil {
			before(i)
		}
		return real()
	}
	return &n
}

func TestCacheWithinTTLScansOnce(t *testing.T) {
	clock := newFakeClock()
	d, err := NewDetector(Options{ProcRoot: fixtureRoot("listen-tcp"), Ports: []int{15008}, TTL: time.Second, Clock: clock, Logger: (&logSink{}).logger()})
	if err != nil {
		t.Fatal(err)
	}
	scans := countScans(d, nil)
	first := d.Check(context.Background())
	clock.Advance(999 * time.Millisecond)
	second := d.Check(context.Background())
	if scans.Load() != 1 {
		t.Fatalf("two calls within the TTL scanned %d times, want 1", scans.Load())
	}
	if !first.Ready || !second.Ready || !first.CheckedAt.Equal(second.CheckedAt) {
		t.Errorf("second call did not get the cached result: %+v vs %+v", first, second)
	}
	// The cached slices are copies: a caller changing them does not
	// change what the next caller sees.
	first.Unreadable = append(first.Unreadable, "x")
	if third := d.Check(context.Background()); len(third.Unreadable) != 0 {
		t.Errorf("cached result changed by a caller: %+v", third)
	}
}

func TestCacheRescanAfterTTLSeesChange(t *testing.T) {
	root := copyFixture(t, "other-port")
	clock := newFakeClock()
	var sink logSink
	d, err := NewDetector(Options{ProcRoot: root, Ports: []int{15008}, TTL: time.Second, Clock: clock, Logger: sink.logger()})
	if err != nil {
		t.Fatal(err)
	}
	scans := countScans(d, nil)
	if r := d.Check(context.Background()); r.Ready {
		t.Fatalf("want not ready first, got %+v", r)
	}
	replaceTable(t, root, "tcp6", "listen-tcp6")
	// Within the TTL the stale answer stands: that is the point of caching.
	clock.Advance(500 * time.Millisecond)
	if r := d.Check(context.Background()); r.Ready {
		t.Fatalf("cached answer should still be not ready, got %+v", r)
	}
	clock.Advance(500 * time.Millisecond)
	if r := d.Check(context.Background()); !r.Ready || r.State != StatePresent {
		t.Fatalf("after the TTL want present, got %+v", r)
	}
	if scans.Load() != 2 {
		t.Errorf("scans = %d, want 2", scans.Load())
	}
	sink.only(t, MsgMissing)
	sink.only(t, MsgPresent)
}

func TestConcurrentCallersShareOneScan(t *testing.T) {
	const callers = 32
	clock := newFakeClock()
	d, err := NewDetector(Options{ProcRoot: fixtureRoot("established"), Ports: []int{15008}, Clock: clock, Logger: (&logSink{}).logger()})
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	scans := countScans(d, func(int64) { <-gate })

	results := make([]Result, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() { results[i] = d.Check(context.Background()) })
	}
	// Hold the scan until every other caller is waiting on it, so none of
	// them can be answered from the cache instead.
	testbin.WaitFor(t, 10*time.Second, "31 callers waiting on the scan", func() bool { return d.waiting.Load() == callers-1 })
	close(gate)
	wg.Wait()

	if scans.Load() != 1 {
		t.Fatalf("%d concurrent callers caused %d scans, want 1", callers, scans.Load())
	}
	for i, r := range results {
		if r.Ready || r.State != StateMissing || len(r.Missing) != 1 || r.Missing[0] != 15008 || !r.CheckedAt.Equal(results[0].CheckedAt) {
			t.Errorf("caller %d got %+v, want the shared missing result %+v", i, r, results[0])
		}
	}
}

func TestPanickingScanDoesNotWedge(t *testing.T) {
	clock := newFakeClock()
	d, err := NewDetector(Options{ProcRoot: fixtureRoot("listen-tcp"), Ports: []int{15008}, Clock: clock, Logger: (&logSink{}).logger()})
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	scans := countScans(d, func(n int64) {
		if n == 1 {
			<-gate
			panic("scan exploded")
		}
	})

	leaderDone := make(chan any)
	go func() {
		defer func() { leaderDone <- recover() }()
		d.Check(context.Background())
	}()
	testbin.WaitFor(t, 10*time.Second, "the first scan to start", func() bool { return scans.Load() == 1 })

	// A caller that joined the panicking scan starts a new one.
	joined := make(chan Result)
	go func() { joined <- d.Check(context.Background()) }()
	testbin.WaitFor(t, 10*time.Second, "a caller waiting on the first scan", func() bool { return d.waiting.Load() == 1 })
	close(gate)

	if p := <-leaderDone; p != "scan exploded" {
		t.Fatalf("leader recovered %v, want the scan's panic", p)
	}
	select {
	case r := <-joined:
		if !r.Ready || r.State != StatePresent {
			t.Errorf("joined caller got %+v, want present", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("caller waiting on a panicked scan is wedged")
	}
	// And a later caller is answered too (from the new scan's cache).
	done := make(chan Result)
	go func() { done <- d.Check(context.Background()) }()
	select {
	case r := <-done:
		if !r.Ready {
			t.Errorf("later caller got %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("caller after a panicked scan is wedged")
	}
	if scans.Load() != 2 {
		t.Errorf("scans = %d, want 2 (the panicked one and its retry)", scans.Load())
	}
}

func TestWaiterHonoursContext(t *testing.T) {
	d, err := NewDetector(Options{ProcRoot: fixtureRoot("listen-tcp"), Ports: []int{15008}, Clock: newFakeClock(), Logger: (&logSink{}).logger()})
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	scans := countScans(d, func(int64) { <-gate })
	leader := make(chan Result)
	go func() { leader <- d.Check(context.Background()) }()
	testbin.WaitFor(t, 10*time.Second, "the scan to start", func() bool { return scans.Load() == 1 })

	ctx, cancel := context.WithCancel(context.Background())
	waiter := make(chan Result)
	go func() { waiter <- d.Check(ctx) }()
	testbin.WaitFor(t, 10*time.Second, "the caller to wait", func() bool { return d.waiting.Load() == 1 })
	cancel()
	if r := <-waiter; !errors.Is(r.Err, context.Canceled) || r.Ready {
		t.Errorf("cancelled waiter got %+v, want Err context.Canceled", r)
	}
	close(gate)
	if r := <-leader; !r.Ready || r.Err != nil {
		t.Errorf("leader got %+v", r)
	}
}
