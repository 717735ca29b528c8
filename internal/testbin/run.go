package testbin

import (
	"context"
	"sync"
	"testing"
)

// Run runs run (name's Run method, say) in the background until the test
// ends: a cleanup cancels its context, waits for it and fails the test
// with the error it returns. Run returns once started is closed, and
// fails the test if run returns before.
func Run(t testing.TB, name string, run func(context.Context) error, started <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: %v", name, err)
		}
	})
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("%s stopped: %v", name, err)
	}
}

// Recorder keeps what a callback gives it (outcomes, reports), safe for
// the callback's goroutine writing while the test reads.
type Recorder[T any] struct {
	mu  sync.Mutex
	all []T
}

// Add records v.
func (r *Recorder[T]) Add(v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, v)
}

// Get is a copy of what was recorded, oldest first.
func (r *Recorder[T]) Get() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]T(nil), r.all...)
}
