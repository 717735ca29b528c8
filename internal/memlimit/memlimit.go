// Package memlimit sets the Go runtime's soft memory limit from the
// container's memory limit, so the garbage collector works harder as the
// heap nears the limit instead of the kernel killing the process.
package memlimit

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
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
// runs about twice as often (docs/performance.md has the measurement).
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
