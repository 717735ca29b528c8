package main

import (
	"fmt"
	"sort"
	"syscall"
	"testing"
	"time"
)

// Failover benchmarks: one op is one failover, timed from the signal (or
// the port closing) to the watcher seeing the standby's label; ns/op is the
// mean failover time, p50-ms/p100-ms the median and worst. Lease settings
// are the tests' short ones (lease 2s, renew 1.5s, retry 0.3s, interval
// 0.3s). Run with:
//
//	go test ./cmd/hagate -run '^$' -bench Failover -benchtime 10x

func BenchmarkFailoverPlanned(b *testing.B) {
	benchFailover(b, func(c *cluster, r *replica) func() {
		c.terminatePod(r.pod)
		if err := r.signal(syscall.SIGTERM); err != nil {
			b.Fatal(err)
		}
		return func() { c.finishPod(r.pod); r.app.close() } // replaced by a new pod
	})
}

func BenchmarkFailoverCrash(b *testing.B) {
	benchFailover(b, func(c *cluster, r *replica) func() {
		r.kill()
		return nil // the container restarts
	})
}

func BenchmarkFailoverAppPortClosed(b *testing.B) {
	benchFailover(b, func(c *cluster, r *replica) func() {
		r.app.close()
		return nil
	})
}

// benchFailover keeps two replicas; each op fails the active one with
// fail. If fail returns a cleanup, the pod is replaced by a new one;
// otherwise the same pod's hagate is restarted (and its port reopened).
func benchFailover(b *testing.B, fail func(*cluster, *replica) func()) {
	c := newCluster(b)
	reps := map[string]*replica{}
	next := 0
	add := func() {
		p := fmt.Sprintf("router-%d", next)
		next++
		reps[p] = c.addReplica(p)
	}
	add()
	add()
	var times []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		c.w.waitFor(b, settle, "one active", exactlyOneActive())
		old := c.theActive()
		var standby string
		for p := range reps {
			if p != old {
				standby = p
			}
		}
		// Both replicas have run a few passes since the last change.
		waitTicks(b, reps[standby], 3)
		b.StartTimer()
		start := time.Now()
		replace := fail(c, reps[old])
		c.w.waitFor(b, 30*time.Second, "standby active", onlyActive(standby))
		times = append(times, time.Since(start))
		b.StopTimer()
		if replace != nil {
			replace()
			delete(reps, old)
			add()
		} else {
			reps[old].app.open(b)
			if !reps[old].running() {
				reps[old].start()
			}
		}
		waitTicks(b, reps[old2(reps, standby)], 3)
		b.StartTimer()
	}
	b.StopTimer()
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	if len(times) > 0 {
		b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(times[len(times)-1].Microseconds())/1000, "p100-ms")
	}
}

// old2 is the replica that is not standby (the one just restarted or
// added).
func old2(reps map[string]*replica, standby string) string {
	for p := range reps {
		if p != standby {
			return p
		}
	}
	return standby
}
