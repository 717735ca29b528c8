package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Deadlines below are generous upper bounds for a loaded 2-core machine,
// not performance targets (see the benchmarks for measured times).
const (
	settle = 10 * time.Second
	// crashTakeover: lease (2s) + retry + a few intervals.
	crashTakeover = 10 * time.Second
)

func startPair(t testing.TB) (*cluster, map[string]*replica) {
	c := newCluster(t)
	rs := map[string]*replica{}
	for _, p := range []string{"router-a", "router-b"} {
		rs[p] = c.addReplica(p)
	}
	c.w.waitFor(t, settle, "exactly one active pod", exactlyOneActive())
	return c, rs
}

func other(rs map[string]*replica, pod string) *replica {
	for p, r := range rs {
		if p != pod {
			return r
		}
	}
	return nil
}

func TestExactlyOneActive(t *testing.T) {
	c, _ := startPair(t)
	leader := c.theActive()
	// The active pod is the Lease holder.
	deadline := time.Now().Add(settle)
	for c.leaseHolder() != leader {
		if time.Now().After(deadline) {
			t.Fatalf("lease holder %q, active pod %q", c.leaseHolder(), leader)
		}
		time.Sleep(50 * time.Millisecond) // polling the apiserver
	}
}

func TestPlannedShutdownHandsOverAndKeepsLabel(t *testing.T) {
	c, rs := startPair(t)
	old := c.theActive()
	standby := other(rs, old).pod

	// Kubelet: the pod is deleted (terminating), then its containers get
	// SIGTERM.
	c.terminatePod(old)
	start := time.Now()
	if err := rs[old].signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	took := c.w.waitFor(t, 3*time.Second, "standby active within 3s of SIGTERM", onlyActive(standby))
	t.Logf("planned failover: standby active %v after SIGTERM was sent (%v after hagate exited)", time.Since(start), took)

	st := c.w.snapshot()[old]
	if !st.Labeled || !st.Terminating {
		t.Fatalf("terminating pod %s: %+v, want it to keep the label while draining", old, st)
	}
	// Let the new leader run a few passes (it must not strip the
	// terminating pod's label), then check the history.
	waitTicks(t, rs[standby], 3)
	for _, e := range c.w.labelEvents(old) {
		if e.State.Terminating && !e.State.Labeled && !e.Gone {
			t.Fatalf("terminating pod %s lost its label: %+v", old, e)
		}
	}
	if st := c.w.snapshot()[old]; !st.Labeled {
		t.Fatalf("terminating pod %s lost its label", old)
	}
	c.finishPod(old)
	c.w.waitFor(t, settle, "old pod gone", func(m map[string]podState) bool { _, ok := m[old]; return !ok })
}

func TestCrashTakeoverAfterLeaseExpiry(t *testing.T) {
	c, rs := startPair(t)
	old := c.theActive()
	standby := other(rs, old).pod
	start := time.Now()
	rs[old].kill()
	// The crashed pod is not terminating (container crash / dead node):
	// the new leader clears its stale label before labelling itself.
	c.w.waitFor(t, crashTakeover, "standby active after the Lease expired", onlyActive(standby))
	t.Logf("crash failover: standby active %v after SIGKILL", time.Since(start))
	if st := c.w.snapshot()[old]; st.Labeled {
		t.Fatalf("crashed pod %s still labelled: %+v", old, st)
	}
	if got := c.leaseHolder(); got != standby {
		t.Fatalf("lease holder %q, want %q", got, standby)
	}

	// Kubelet restarts the container: the old pod rejoins as standby.
	rs[old].start()
	waitTicks(t, rs[old], 3)
	c.w.waitFor(t, settle, "new leader still the only active pod", onlyActive(standby))
}

func TestLabelRemovedByHandComesBack(t *testing.T) {
	c, _ := startPair(t)
	leader := c.theActive()
	if err := c.setLabel(leader, false, 0); err != nil {
		t.Fatal(err)
	}
	c.w.waitFor(t, settle, "label removed", noneActive)
	took := c.w.waitFor(t, settle, "label restored", onlyActive(leader))
	t.Logf("label restored %v after it was removed (interval 0.3s)", took)
}

func TestLabelAddedByHandToStandbyIsRemoved(t *testing.T) {
	c, rs := startPair(t)
	leader := c.theActive()
	standby := other(rs, leader).pod
	if err := c.setLabel(standby, true, 1); err != nil {
		t.Fatal(err)
	}
	c.w.waitFor(t, settle, "hand-added label seen", func(m map[string]podState) bool { return m[standby].Labeled })
	c.w.waitFor(t, settle, "hand-added label removed", onlyActive(leader))

	// Without the standby's hagate, the leader's sweep removes it.
	rs[standby].kill()
	if err := c.setLabel(standby, true, 2); err != nil {
		t.Fatal(err)
	}
	c.w.waitFor(t, settle, "hand-added label seen", func(m map[string]podState) bool { return m[standby].Labeled })
	c.w.waitFor(t, settle, "leader removed the stale label", onlyActive(leader))
}

func TestAppPortClosedHandsOver(t *testing.T) {
	c, rs := startPair(t)
	old := c.theActive()
	standby := other(rs, old).pod
	start := time.Now()
	rs[old].app.close()
	c.w.waitFor(t, settle, "standby active after the leader's app port closed", onlyActive(standby))
	t.Logf("app-port failover: standby active %v after the port closed", time.Since(start))
	if got := c.leaseHolder(); got != standby {
		t.Fatalf("lease holder %q, want %q (the unhealthy leader must give the Lease up)", got, standby)
	}
	// Healthy again: it contends, but the standby keeps leading.
	mark := rs[old].logMark()
	rs[old].app.open(t)
	rs[old].waitLog(t, mark, settle, "app healthy; contending")
	waitTicks(t, rs[old], 3)
	c.w.waitFor(t, settle, "new leader still active", onlyActive(standby))
}

func TestUnhealthyReplicaDoesNotContend(t *testing.T) {
	c := newCluster(t)
	a := c.newReplica("router-a", newApp(t))
	a.app.close() // before hagate starts: it must never contend
	a.start()
	a.waitLog(t, 0, settle, "app unhealthy; not contending")
	waitTicks(t, a, 3)
	if _, err := c.getLease(); err == nil {
		t.Fatalf("an unhealthy replica created or holds the Lease (holder %q)", c.leaseHolder())
	}
	a.app.open(t)
	c.w.waitFor(t, settle, "replica active once its app is up", onlyActive("router-a"))
}

func TestRequiredListenerMissingNeverActive(t *testing.T) {
	c := newCluster(t)
	// A port nothing listens on (reserved and released by the test).
	missing := freePort(t)
	a := c.addReplica("router-a", "--readiness-required-listener="+strconv.Itoa(missing))
	a.waitLog(t, 0, settle, "required listeners missing")
	waitTicks(t, a, 3)
	if _, err := c.getLease(); err == nil {
		t.Fatal("a replica with a missing required listener created the Lease")
	}
	// A second replica without that requirement leads.
	b := c.addReplica("router-b")
	c.w.waitFor(t, settle, "replica with listeners present active", onlyActive("router-b"))

	// Once the listener exists the first replica is a healthy standby and
	// takes over when the leader shuts down.
	mark := a.logMark()
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(missing))
	if err != nil {
		t.Fatalf("listen on the required port: %v", err)
	}
	defer ln.Close()
	a.waitLog(t, mark, settle, "app healthy; contending")
	for _, e := range c.w.labelEvents("router-a") {
		if e.State.Labeled {
			t.Fatalf("router-a was active while its required listener was missing: %+v", e)
		}
	}
	c.terminatePod("router-b")
	if err := b.signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.w.waitFor(t, settle, "replica active once its listener exists", onlyActive("router-a"))
}

func TestRequiredListenerPresentAllowsActive(t *testing.T) {
	c := newCluster(t)
	app := newApp(t)
	c.newReplica("router-a", app, "--readiness-required-listener="+strconv.Itoa(app.port)).start()
	c.w.waitFor(t, settle, "active with its required listener present", onlyActive("router-a"))
}

func TestLeaseLostWhileAliveDropsLabel(t *testing.T) {
	c, rs := startPair(t)
	leader := c.theActive()
	// Someone else takes the Lease (as if the leader had been partitioned
	// and a new holder had acquired it).
	intruder, dur := "intruder", int32(3600)
	c.updateLease(t, func(l *coordinationv1.Lease) {
		now := metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime, l.Spec.AcquireTime = &intruder, &dur, &now, &now
	})
	took := c.w.waitFor(t, settle, "former leader's label dropped", noneActive)
	t.Logf("label dropped %v after the Lease was taken", took)
	waitTicks(t, rs[leader], 3)
	if a := activePods(c.w.snapshot()); len(a) != 0 {
		t.Fatalf("pods %v active while the Lease belongs to someone else", a)
	}
	// The intruder releases: one of ours leads again.
	empty, one := "", int32(1)
	c.updateLease(t, func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = &empty, &one
	})
	c.w.waitFor(t, settle, "a replica active after the Lease was released", exactlyOneActive())
}

func TestMetricsAndHealthz(t *testing.T) {
	c := newCluster(t)
	mport, hport := freePort(t), freePort(t)
	c.newReplica("router-a", newApp(t),
		"--metrics-addr=127.0.0.1:"+strconv.Itoa(mport),
		"--health-addr=127.0.0.1:"+strconv.Itoa(hport)).start()
	c.w.waitFor(t, settle, "active", onlyActive("router-a"))

	want := []string{"autoconfig_hagate_is_leader 1", "autoconfig_hagate_active 1", "autoconfig_hagate_healthy 1",
		`autoconfig_hagate_label_fixes_total{action="add"} 1`, `autoconfig_hagate_leader_transitions_total{to="leader"} 1`,
		`autoconfig_hagate_active_transitions_total{to="active"} 1`}
	body := pollHTTP(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", mport), func(b string) bool {
		for _, w := range want {
			if !strings.Contains(b, w) {
				return false
			}
		}
		return true
	})
	if strings.Contains(body, "leader_election_master_status") {
		t.Error("client-go's global metrics leaked into hagate's registry")
	}
	for _, u := range []string{fmt.Sprintf("http://127.0.0.1:%d/healthz", hport), fmt.Sprintf("http://127.0.0.1:%d/healthz", mport)} {
		pollHTTP(t, u, func(b string) bool { return strings.TrimSpace(b) == "ok" })
	}
}

// pollHTTP GETs url until ok(body) with status 200, failing at a deadline.
func pollHTTP(t testing.TB, url string, ok func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(settle)
	var last string
	for {
		resp, err := http.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = string(b)
			if resp.StatusCode == http.StatusOK && ok(last) {
				return last
			}
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: condition not met; last answer:\n%s", url, last)
		}
		time.Sleep(50 * time.Millisecond) // polling a server
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// waitTicks waits until r has logged n more label-loop passes. hagate logs
// each pass at debug level, which gives "it had the chance to act" a
// condition instead of a sleep.
func waitTicks(t testing.TB, r *replica, n int) {
	t.Helper()
	base := strings.Count(r.logs(), tickMarker)
	deadline := time.Now().Add(settle)
	for strings.Count(r.logs(), tickMarker) < base+n {
		if time.Now().After(deadline) {
			t.Fatalf("hagate for %s did not complete %d passes within %v", r.pod, n, settle)
		}
		time.Sleep(20 * time.Millisecond) // polling a log buffer
	}
}

const tickMarker = `msg="pass done"`

func TestRestartedLeaderKeepsLabel(t *testing.T) {
	c, rs := startPair(t)
	leader := c.theActive()
	// The container crashes and kubelet restarts it at once, well inside
	// the Lease: same identity, so it simply renews, and the Service must
	// not lose its endpoint in between.
	rs[leader].kill()
	rs[leader].start()
	waitTicks(t, rs[leader], 5)
	c.w.waitFor(t, settle, "restarted leader active", onlyActive(leader))
	seen := false
	for _, e := range c.w.labelEvents(leader) {
		seen = seen || e.State.Labeled
		if seen && !e.State.Labeled {
			t.Fatalf("restarted leader %s lost its label: %+v", leader, e)
		}
	}
}
