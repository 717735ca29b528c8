package memlimit

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
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
