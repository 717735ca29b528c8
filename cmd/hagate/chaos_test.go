package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestChaos runs random rounds of SIGKILL (with a container restart),
// planned pod deletion (SIGTERM, drain, replacement pod), app-port flaps and
// label tampering against two replicas, while the pod watcher checks after
// every single pod event that no two non-terminating pods carry a label
// hagate put there. HAGATE_CHAOS_ROUNDS and HAGATE_CHAOS_SEED override the
// round count (default 50) and the seed (default: time).
//
// The random pauses below are the chaos schedule itself (how long a
// container stays dead, a port stays closed, a pod drains); outcomes are
// waited for with deadlines.
func TestChaos(t *testing.T) {
	rounds := envInt(t, "HAGATE_CHAOS_ROUNDS", 50)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("HAGATE_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("HAGATE_CHAOS_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("chaos: %d rounds, HAGATE_CHAOS_SEED=%d", rounds, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	pause := func(lo, hi time.Duration) {
		time.Sleep(lo + time.Duration(rng.Int64N(int64(hi-lo)+1)))
	}

	c := newCluster(t)
	var slots [2]*replica
	gen := [2]int{}
	podName := func(slot int) string { return fmt.Sprintf("router-%c-%d", 'a'+slot, gen[slot]) }
	for s := range slots {
		slots[s] = c.addReplica(podName(s))
	}
	c.w.waitFor(t, settle, "one active pod", exactlyOneActive())

	counts := map[string]int{}
	converged := 0
	var worstConverge time.Duration
	start := time.Now()
	for i := 0; i < rounds; i++ {
		s := rng.IntN(2)
		r := slots[s]
		active := activePods(c.w.snapshot())
		var action string
		switch rng.IntN(5) {
		case 0:
			action = "sigkill+restart"
			r.kill()
			pause(0, 4*time.Second) // dead for a while: sometimes past the 2s Lease
			r.start()
		case 1:
			action = "sigterm+replace"
			c.terminatePod(r.pod)
			if err := r.signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			pause(0, time.Second) // in-flight streams drain
			c.finishPod(r.pod)
			r.app.close()
			gen[s]++
			slots[s] = c.addReplica(podName(s))
		case 2:
			action = "app-port-flap"
			r.app.close()
			pause(100*time.Millisecond, 1500*time.Millisecond)
			r.app.open(t)
		case 3:
			action = "tamper-remove"
			if len(active) > 0 {
				if err := c.setLabel(active[0], false, 0); err != nil {
					t.Logf("tamper-remove %s: %v", active[0], err)
				}
			}
		case 4:
			action = "tamper-add"
			if !contains(active, r.pod) {
				if err := c.setLabel(r.pod, true, i+1); err != nil {
					t.Logf("tamper-add %s: %v", r.pod, err)
				}
			}
		}
		counts[action]++
		if rng.IntN(2) == 0 {
			// Let it settle: exactly one active among the current pods.
			d := c.w.waitFor(t, 20*time.Second, fmt.Sprintf("convergence after round %d (%s)", i, action), exactlyOneActive(slots[0].pod, slots[1].pod))
			worstConverge = max(worstConverge, d)
			converged++
		} else {
			pause(0, 600*time.Millisecond) // next blow before things settled
		}
	}
	c.w.waitFor(t, 20*time.Second, "final convergence", exactlyOneActive(slots[0].pod, slots[1].pod))

	gap, violations := c.w.gapStats()
	var names []string
	for k := range counts {
		names = append(names, k)
	}
	sort.Strings(names)
	var mix string
	for _, k := range names {
		mix += fmt.Sprintf(" %s=%d", k, counts[k])
	}
	t.Logf("chaos: %d rounds in %v (seed %d):%s; %d pod events watched; %d rounds waited for convergence (longest wait %v); longest no-active gap %v; invariant violations %d",
		rounds, time.Since(start).Round(time.Millisecond), seed, mix, c.w.eventCount(), converged, worstConverge.Round(time.Millisecond), gap.Round(time.Millisecond), violations)
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return v
}
