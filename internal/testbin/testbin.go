// Package testbin is the one home of the helpers the tests across the
// repository share, and of the hack tools' process runner: building the
// package under test into a real executable (with -race when the test
// itself runs under -race), a goroutine-safe buffer for a child process's
// output, the live heap the memory tests measure, a child process with its
// output in a log file (Proc), a component run until the test ends (Run),
// a goroutine-safe record of what callbacks give (Recorder), waiting for a
// condition (WaitFor, WaitEvery, WaitUntil, WaitCtx), the module root
// (ModuleRoot, Root) and Must. It imports the standard library only, so
// any test can use it.
package testbin

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
)

// Build compiles the package in the current directory (the test's own
// package) into dir/name and returns the path. Under -race the binary is
// race-instrumented too, so the race detector watches the real process.
func Build(dir, name string) (string, error) {
	bin := filepath.Join(dir, name)
	args := []string{"build", "-o", bin}
	if RaceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", name, err, out)
	}
	return bin, nil
}

// SyncBuffer is a bytes.Buffer safe for a child process writing while a
// test reads.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// HeapAfterGC is the live heap after two collections: what the memory
// tests measure before and after building what they keep.
func HeapAfterGC() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
