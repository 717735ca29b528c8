package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/reload/reloadtest"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// reportLatencies reports p50/p99/max of ds in milliseconds.
func reportLatencies(b *testing.B, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	q := func(p float64) float64 {
		i := int(p*float64(len(ds))+0.5) - 1
		i = max(0, min(i, len(ds)-1))
		return float64(ds[i]) / float64(time.Millisecond)
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(float64(ds[len(ds)-1])/float64(time.Millisecond), "max-ms")
}

// BenchmarkSwapToHUP measures a kubelet "..data" swap until the target has
// received SIGHUP (its own receive timestamp), through the real binary.
// The debounce dominates; the sub-benchmarks show its share.
func BenchmarkSwapToHUP(b *testing.B) {
	for _, debounce := range []string{"250ms", "50ms"} {
		b.Run("debounce="+debounce, func(b *testing.B) {
			dir := b.TempDir()
			reloadtest.KubeletSwap(b, dir, map[string]string{"config.yaml": "v0"})
			name := fmt.Sprintf("cache-aware-router-bench-%d-%s", os.Getpid(), debounce)
			cart := reloadtest.StartHUPCounter(b, name)
			startSidecar(b, "--watch", dir, "--process", name, "--debounce", debounce, "--log-level=info")
			var ds []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				reloadtest.KubeletSwap(b, dir, map[string]string{"config.yaml": fmt.Sprintf("v%d", i+1)})
				testbin.WaitFor(b, wait, "the HUP", func() bool { return cart.Count() == i+1 })
				ds = append(ds, cart.Times()[i].Sub(t0))
			}
			b.StopTimer()
			reportLatencies(b, ds)
		})
	}
}

// BenchmarkConfigMapToServing measures API mode end to end: a ConfigMap
// update on a real apiserver until nginx serves the new content (watch →
// atomic write → debounce → nginx -t → socket check → HUP → new workers).
func BenchmarkConfigMapToServing(b *testing.B) {
	a, n, _, _ := startAPIMode(b, func(n *nginxtest.Nginx) map[string]string {
		return map[string]string{routeFile("a"): routeConf(n, "a", "v0")}
	})
	waitServesB(b, n, "v0", nil)
	var ds []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		body := fmt.Sprintf("v%d", i+1)
		t0 := time.Now()
		a.update(b, map[string]string{routeFile("a"): routeConf(n, "a", body)})
		var served time.Time
		waitServesB(b, n, body, &served)
		ds = append(ds, served.Sub(t0))
	}
	b.StopTimer()
	reportLatencies(b, ds)
}

// waitServesB polls route a every 2 ms until it answers body and records
// when it did.
func waitServesB(b *testing.B, n *nginxtest.Nginx, body string, at *time.Time) {
	deadline := time.Now().Add(wait)
	for {
		if _, got := nginxtest.Get(b, n.URL("a")); got == body+"\n" {
			if at != nil {
				*at = time.Now()
			}
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("route a never served %q", body)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// BenchmarkChangeToServed measures mounted mode end to end with the
// default timing (--debounce 250ms, --max-delay 2s, nginx -t as check): a
// kubelet swap changing route b until nginx serves it, on a quiet volume
// and while another key of the same ConfigMap is rewritten every 100 ms
// (a steady writer). Without --max-delay the flood postponed every reload
// until it stopped.
func BenchmarkChangeToServed(b *testing.B) {
	for _, flood := range []time.Duration{0, 100 * time.Millisecond} {
		name := "quiet"
		if flood > 0 {
			name = "flood=" + flood.String()
		}
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			n := nginxtest.Start(b, nginxtest.Options{RoutesDir: dir})
			var mu sync.Mutex
			files := map[string]string{routeFile("a"): routeConf(n, "a", "a0"), routeFile("b"): routeConf(n, "b", "b0")}
			swap := func(key, body string) {
				mu.Lock()
				defer mu.Unlock()
				files[routeFile(key)] = routeConf(n, key, body)
				reloadtest.KubeletSwap(b, dir, files)
			}
			swap("a", "a0")
			if err := n.Reload(); err != nil {
				b.Fatal(err)
			}
			startSidecar(b, "--watch", dir, "--process", n.MasterMatch(), "--sock-dir", n.SockDir(), "--check-cmd", checkCmd(n), "--log-level=info")
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				if flood == 0 {
					return
				}
				for i := 1; ; i++ {
					select {
					case <-stop:
						return
					case <-time.After(flood):
						swap("a", fmt.Sprintf("a%d", i))
					}
				}
			}()
			var ds []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				body := fmt.Sprintf("b%d", i+1)
				t0 := time.Now()
				swap("b", body)
				deadline := t0.Add(wait)
				for {
					if _, got := nginxtest.Get(b, n.URL("b")); got == body+"\n" {
						ds = append(ds, time.Since(t0))
						break
					}
					if time.Now().After(deadline) {
						b.Fatalf("route b never served %q", body)
					}
					time.Sleep(2 * time.Millisecond)
				}
				// Changes arrive at random points of the debounce cycle.
				time.Sleep(time.Duration(rand.Int64N(int64(500 * time.Millisecond))))
			}
			b.StopTimer()
			close(stop)
			<-done
			reportLatencies(b, ds)
		})
	}
}
