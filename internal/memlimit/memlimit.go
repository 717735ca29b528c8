// Package memlimit sets the Go runtime's soft memory limit: from the
// container's memory limit, so the garbage collector works harder as the
// heap nears the limit instead of the kernel killing the process; and,
// below that, following the process's live data (Follower), so the memory
// a burst of work needed returns to the OS instead of staying resident.
package memlimit

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"
)

// DefaultRatio is the share of the container limit given to the Go heap
// and runtime: 10 % stays for what the Go runtime does not count (thread
// stacks outside the heap, the binary's text, page-cache charge).
const DefaultRatio = 0.9

// Limit reads the memory limit of the cgroup the process runs in (v2
// memory.max, else v1 memory.limit_in_bytes) under root ("/sys/fs/cgroup"
// in a container). ok is false when there is none ("max", or v1's
// page-counter maximum).
func Limit(root string) (limit int64, ok bool, err error) {
	for _, f := range []string{"memory.max", "memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, false, err
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, false, nil
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("%s: %w", f, err)
		}
		if v >= math.MaxInt64/2 { // cgroup v1's "unlimited" (page-counter max)
			return 0, false, nil
		}
		return v, true, nil
	}
	return 0, false, nil
}

// Set sets the soft limit to ratio × the cgroup's limit unless GOMEMLIMIT
// is set (the operator's choice wins) or ratio is 0. It returns the limit
// set (0 = none) and why.
func Set(root string, ratio float64) (int64, string, error) {
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		return 0, "GOMEMLIMIT=" + v + " is set", nil
	}
	if ratio <= 0 {
		return 0, "disabled", nil
	}
	limit, ok, err := Limit(root)
	if err != nil || !ok {
		return 0, "no container memory limit", err
	}
	soft := int64(float64(limit) * ratio)
	debug.SetMemoryLimit(soft)
	return soft, fmt.Sprintf("%.0f%% of the container limit %d", ratio*100, limit), nil
}

// DefaultGCPercent is the controller's GOGC. Its live heap is small (about
// 26 MB at 1000 routes over 10,000 pods) and its CPU mostly idle, so the
// Go default of 100 — a heap twice the live data — spends memory to save
// CPU that is not scarce. 50 keeps the heap at 1.5× its live data; the GC
// runs about twice as often (docs/performance-history.md has the measurement).
const DefaultGCPercent = 50

// SetGCPercent sets GOGC to percent unless the GOGC environment variable
// is set (the operator's choice wins). A negative percent turns the GC off
// as with GOGC=off; 0 leaves the Go default. It returns what is in effect.
func SetGCPercent(percent int) string {
	if v := os.Getenv("GOGC"); v != "" {
		return "GOGC=" + v + " is set"
	}
	if percent == 0 {
		return "Go default (100)"
	}
	debug.SetGCPercent(percent)
	return strconv.Itoa(percent)
}

// DefaultLiveRatio is how far the Go runtime's memory may grow over the
// largest live data (live heap and goroutine stacks) the process has had
// before the soft memory limit makes the GC collect (Follow). GOGC alone
// bounds only the heap's allocations: the memory a burst of work (the
// start-up's thousand reconciles, a rollout) made the heap grow to stays
// resident, idle, until the runtime's background scavenger returns it,
// slowly, and fragmentation and the GC's own metadata come on top. At
// 1000 routes over 10,000 pods that was 10–15 MiB above what GOGC 50
// accounts for. A limit at 1.5× the largest live data makes the scavenger
// return it promptly and caps the bursts, for 1.5–2 s more CPU in a
// 1000-route start-up (docs/performance-history.md has the measurements).
const DefaultLiveRatio = 1.5

// DefaultLiveFloor is the least soft limit Follow sets: the limit never
// binds while the live data is small (a start-up that has not read most of
// its caches yet, a cluster of a few routes), where the GC would run often
// for a few MiB.
const DefaultLiveFloor = 48 << 20

// liveInterval is how often Follow reads the live data: the live heap is
// known after each collection, several a second while the controller
// works.
const liveInterval = 250 * time.Millisecond

// Follower keeps the soft memory limit at Ratio × the largest live data
// seen (at least Floor), at most Cap (the container-derived limit, 0 =
// none). The largest, not the current: a limit that followed the live data
// down after a burst would make the GC run hard at the next one (the
// start-up's live data grows for seconds), and one that only grows with
// the cluster never binds tighter than Ratio × the live data.
type Follower struct {
	Ratio float64
	Floor int64
	Cap   int64
}

// Limit is the soft limit for live bytes of live data.
func (f Follower) Limit(live int64) int64 {
	l := max(int64(f.Ratio*float64(live)), f.Floor)
	if f.Cap > 0 {
		l = min(l, f.Cap)
	}
	return l
}

// liveSamples are the runtime metrics Follow reads: the heap's live bytes
// as of the last collection, and the goroutine stacks.
var liveSamples = []string{"/gc/heap/live:bytes", "/memory/classes/heap/stacks:bytes"}

// Live reads the live data: the live heap at the last collection plus the
// goroutine stacks.
func Live() int64 {
	s := make([]metrics.Sample, len(liveSamples))
	for i, n := range liveSamples {
		s[i].Name = n
	}
	metrics.Read(s)
	var live int64
	for _, x := range s {
		if x.Value.Kind() == metrics.KindUint64 {
			live += int64(x.Value.Uint64())
		}
	}
	return live
}

// Follow sets the soft limit to f.Limit of the largest Live() seen, now
// and then every liveInterval until ctx ends, and then leaves the limit at
// Cap (or none).
// It does nothing (and returns false) when f.Ratio is 0 or GOMEMLIMIT is
// set (the operator's choice wins).
func (f Follower) Follow(ctx context.Context) bool {
	if f.Ratio <= 0 || os.Getenv("GOMEMLIMIT") != "" {
		return false
	}
	var peak int64
	set := func() {
		peak = max(peak, Live())
		debug.SetMemoryLimit(f.Limit(peak))
	}
	set()
	go func() {
		t := time.NewTicker(liveInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				if f.Cap > 0 {
					debug.SetMemoryLimit(f.Cap)
				} else {
					debug.SetMemoryLimit(math.MaxInt64)
				}
				return
			case <-t.C:
				set()
			}
		}
	}()
	return true
}
