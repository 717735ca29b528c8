package sink

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/compiler"
)

// BenchmarkApply: one Apply of one route's key into a ConfigMap on the
// real API server (envtest), the Writer reading metadata straight from the
// API (no cache): a changed key, a key new to the ConfigMap, and a no-op,
// unbatched (Window=0) and with a 1 ms window; and a burst of 20 routes
// sharing one ConfigMap (one iteration = the whole burst).
func BenchmarkApply(b *testing.B) {
	ctx := context.Background()
	for _, win := range []struct {
		name   string
		window time.Duration
	}{{"unbatched", 0}, {"window=1ms", time.Millisecond}} {
		b.Run(win.name+"/changed-key", func(b *testing.B) {
			ns := setup(b, map[string]string{"base.conf": "keep", "a.conf": "0"}, nil)
			w := &Writer{Client: k8s, APIReader: k8s, Window: win.window}
			b.ResetTimer()
			for i := range b.N {
				res, err := w.Apply(ctx, ns, []compiler.Output{out(ns, "a.conf", fmt.Sprint(i+1))}, nil)
				if err != nil || res[0].State != Written {
					b.Fatalf("%v %v", res, err)
				}
			}
		})
		b.Run(win.name+"/new-key", func(b *testing.B) {
			var ns string
			var w *Writer
			for i := range b.N {
				if i%256 == 0 { // a fresh ConfigMap now and then: it does not grow without bound
					b.StopTimer()
					ns = setup(b, map[string]string{"base.conf": "keep"}, nil)
					w = &Writer{Client: k8s, APIReader: k8s, Window: win.window}
					if _, err := w.Apply(ctx, ns, []compiler.Output{out(ns, "first.conf", "x")}, nil); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				res, err := w.Apply(ctx, ns, []compiler.Output{out(ns, fmt.Sprintf("k%d.conf", i), "x")}, nil)
				if err != nil || res[0].State != Written {
					b.Fatalf("%v %v", res, err)
				}
			}
		})
		b.Run(win.name+"/unchanged", func(b *testing.B) {
			ns := setup(b, map[string]string{"a.conf": "same"}, nil)
			w := &Writer{Client: k8s, APIReader: k8s, Window: win.window}
			b.ResetTimer()
			for range b.N {
				res, err := w.Apply(ctx, ns, []compiler.Output{out(ns, "a.conf", "same")}, nil)
				if err != nil || res[0].State != Unchanged {
					b.Fatalf("%v %v", res, err)
				}
			}
		})
	}
	b.Run("window=1ms/20-routes", func(b *testing.B) {
		ns := setup(b, map[string]string{"base.conf": "keep"}, nil)
		w := &Writer{Client: k8s, APIReader: k8s, Window: time.Millisecond}
		b.ResetTimer()
		for i := range b.N {
			var wg sync.WaitGroup
			for r := range 20 {
				wg.Go(func() {
					res, err := w.Apply(ctx, ns, []compiler.Output{out(ns, fmt.Sprintf("r%02d.conf", r), fmt.Sprint(i))}, nil)
					if err != nil || res[0].State != Written {
						b.Errorf("%v %v", res, err)
					}
				})
			}
			wg.Wait()
		}
	})
}
