package memlimit

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/testbin"
)

func TestLimit(t *testing.T) {
	for _, c := range []struct {
		file, content string
		want          int64
		ok            bool
	}{
		{"memory.max", "536870912\n", 536870912, true},
		{"memory.max", "max\n", 0, false},
		{"memory/memory.limit_in_bytes", "268435456\n", 268435456, true},
		{"memory/memory.limit_in_bytes", "9223372036854771712\n", 0, false},
	} {
		root := t.TempDir()
		os.MkdirAll(filepath.Join(root, "memory"), 0o755)
		if err := os.WriteFile(filepath.Join(root, c.file), []byte(c.content), 0o644); err != nil {
			t.Fatal(err)
		}
		got, ok, err := Limit(root)
		if err != nil || got != c.want || ok != c.ok {
			t.Errorf("%s=%q: %d %v %v, want %d %v", c.file, c.content, got, ok, err, c.want, c.ok)
		}
	}
	if _, ok, err := Limit(t.TempDir()); ok || err != nil {
		t.Errorf("no cgroup files: ok=%v err=%v", ok, err)
	}
}

func TestSet(t *testing.T) {
	defer debug.SetMemoryLimit(math.MaxInt64)
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "memory.max"), []byte("1000000000\n"), 0o644)
	t.Setenv("GOMEMLIMIT", "")
	got, why, err := Set(root, 0.9)
	if err != nil || got != 900000000 || debug.SetMemoryLimit(-1) != 900000000 {
		t.Fatalf("Set: %d %q %v (runtime %d)", got, why, err, debug.SetMemoryLimit(-1))
	}
	t.Setenv("GOMEMLIMIT", "300MiB")
	if got, why, _ := Set(root, 0.9); got != 0 || why != "GOMEMLIMIT=300MiB is set" {
		t.Fatalf("with GOMEMLIMIT: %d %q", got, why)
	}
}

func TestSetGCPercent(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	t.Setenv("GOGC", "")
	if got := SetGCPercent(50); got != "50" || debug.SetGCPercent(100) != 50 {
		t.Fatalf("SetGCPercent(50) = %q, or GOGC not 50", got)
	}
	if got := SetGCPercent(0); got != "Go default (100)" || debug.SetGCPercent(100) != 100 {
		t.Fatalf("SetGCPercent(0) = %q, or GOGC changed", got)
	}
	t.Setenv("GOGC", "200")
	debug.SetGCPercent(200) // what the runtime read from the environment
	if got := SetGCPercent(50); got != "GOGC=200 is set" || debug.SetGCPercent(200) != 200 {
		t.Fatalf("with GOGC=200: %q, or GOGC overridden", got)
	}
}

func TestFollowerLimit(t *testing.T) {
	f := Follower{Ratio: 1.5, Floor: 48 << 20}
	for _, c := range []struct{ live, want int64 }{
		{0, 48 << 20},          // nothing live yet: the floor
		{20 << 20, 48 << 20},   // 30 MiB: still the floor
		{40 << 20, 60 << 20},   // 1.5×
		{400 << 20, 600 << 20}, // grows with the cluster
	} {
		if got := f.Limit(c.live); got != c.want {
			t.Errorf("Limit(%d MiB) = %d MiB, want %d MiB", c.live>>20, got>>20, c.want>>20)
		}
	}
	f.Cap = 500 << 20 // the container's limit wins
	if got := f.Limit(400 << 20); got != 500<<20 {
		t.Errorf("capped: %d MiB, want 500", got>>20)
	}
}

// TestFollow runs the follower in this process: the runtime's limit
// becomes 1.5× the live data (or the floor), grows with a live data that
// grows, does not fall when it shrinks, and is lifted when the context
// ends; GOMEMLIMIT turns it off.
func TestFollow(t *testing.T) {
	defer debug.SetMemoryLimit(math.MaxInt64)
	t.Setenv("GOMEMLIMIT", "")
	f := Follower{Ratio: 1.5, Floor: 8 << 20}
	ctx, cancel := context.WithCancel(context.Background())
	if !f.Follow(ctx) {
		t.Fatal("Follow did not start")
	}
	limit := func() int64 { return debug.SetMemoryLimit(-1) }
	if l := limit(); l == math.MaxInt64 || l < f.Floor {
		t.Fatalf("limit after Follow: %d", l)
	}
	// 64 MiB more live data: the limit follows it up.
	keep := make([][]byte, 64)
	for i := range keep {
		keep[i] = make([]byte, 1<<20)
		keep[i][0] = 1
	}
	runtime.GC()
	testbin.WaitEvery(t, 10*time.Second, 20*time.Millisecond, "the limit to follow 64 MiB of live data up", func() bool { return limit() >= int64(1.5*float64(64<<20)) })
	high := limit()
	runtime.KeepAlive(keep)
	keep = nil
	runtime.GC()
	runtime.GC()
	time.Sleep(3 * liveInterval)
	if l := limit(); l < high {
		t.Fatalf("the limit fell with the live data: %d MiB after %d MiB", l>>20, high>>20)
	}
	cancel()
	testbin.WaitEvery(t, 10*time.Second, 20*time.Millisecond, "the limit to be lifted when the context ends", func() bool { return limit() == math.MaxInt64 })

	t.Setenv("GOMEMLIMIT", "300MiB")
	if f.Follow(context.Background()) {
		t.Fatal("Follow started although GOMEMLIMIT is set")
	}
	if (Follower{}).Follow(context.Background()) {
		t.Fatal("Follow started with ratio 0")
	}
}
