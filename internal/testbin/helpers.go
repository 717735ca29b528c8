package testbin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Must fails the test at once when err is not nil.
func Must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// ModuleRoot walks up from the working directory to the directory holding
// go.mod. Programs (hack/demo, hack/scale) call it as well as tests.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Root is ModuleRoot for a test: the module root, or the test fails.
func Root(t testing.TB) string {
	t.Helper()
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// WaitFor polls cond every 5 ms until it holds or the deadline passes, then
// fails the test with msg.
func WaitFor(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	WaitEvery(t, timeout, 5*time.Millisecond, msg, cond)
}

// WaitEvery is WaitFor polling every interval: a condition that asks an
// API server is not asked every 5 ms.
func WaitEvery(t testing.TB, timeout, interval time.Duration, msg string, cond func() bool) {
	t.Helper()
	WaitUntil(t, timeout, interval, msg, func() string {
		if cond() {
			return ""
		}
		return "the condition does not hold"
	})
}

// WaitUntil polls missing every interval until it returns "" or the
// deadline passes, then fails the test with msg and what missing said
// last: what is still missing, for a failure that can be read without a
// rerun.
func WaitUntil(t testing.TB, timeout, interval time.Duration, msg string, missing func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		why := missing()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %s", timeout, msg, why)
		}
		time.Sleep(interval)
	}
}

// WaitCtx polls cond every interval until it holds, failing the test with
// msg when ctx ends first: the waits of a test that share one deadline.
func WaitCtx(t testing.TB, ctx context.Context, interval time.Duration, msg string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", msg)
		case <-time.After(interval):
		}
	}
}
