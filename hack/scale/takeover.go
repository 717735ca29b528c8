package main

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelsphere/autoconfig/hack/scale/procmem"
)

// leaderElectionID is the Lease the controller replicas compete for
// (cmd/autoconfig LeaderElectionID).
const leaderElectionID = "autoconfig.routing.modelsphere.dev"

// takeoverArgs are the chart's leader-election arguments
// (deploy/helm/autoconfig/templates/deployment.yaml, with the values'
// defaults) for both replicas of a -takeover run; the metrics and probe
// addresses stay "0" (two processes on one host).
var takeoverArgs = []string{"--leader-elect=true", "--leader-election-namespace=" + leaseNamespace,
	"--log-level=info", "--kube-api-qps=500", "--kube-api-burst=1000"}

// takeoverResult is a -takeover run's takeover phase: the leader is
// killed with SIGKILL (no Lease release), some routes' pods move right
// after, and the standby must take the Lease and converge.
type takeoverResult struct {
	// FirstLeaseSeconds: from the first replica's start until the Lease
	// watch saw it hold the Lease.
	FirstLeaseSeconds float64 `json:"firstLeaseSeconds"`
	// LeaseDurationSeconds is the Lease's spec.leaseDurationSeconds.
	LeaseDurationSeconds int32 `json:"leaseDurationSeconds"`
	// StandbyRSSKiB is the standby's VmRSS just before the kill.
	StandbyRSSKiB int64 `json:"standbyRSSKiB"`

	ChangedRoutes   int `json:"changedRoutes"`
	PodStatusWrites int `json:"podStatusWrites"`
	SliceWrites     int `json:"endpointSliceWrites"`
	// WriteSeconds: from the kill until the change's last write returned.
	WriteSeconds float64 `json:"writeSeconds"`

	// AcquireSeconds: from the kill until the Lease watch saw the
	// standby hold the Lease.
	AcquireSeconds float64 `json:"acquireSeconds"`
	// ConvergeSeconds: from that acquisition until the poll that saw
	// every ConfigMap key current (the change included).
	ConvergeSeconds float64 `json:"convergeSeconds"`
	// TotalSeconds: from the kill until converged.
	TotalSeconds float64 `json:"totalSeconds"`
	// CPUSeconds is the new leader's CPU from the kill until converged;
	// CPUSecondsSettled until converged + -settle.
	CPUSeconds        float64 `json:"cpuSeconds"`
	CPUSecondsSettled float64 `json:"cpuSecondsSettled"`

	// Writes from the kill until converged + -settle, all the new
	// leader's (the old one is dead): ConfigMap writes, per ConfigMap,
	// and split into the ConfigMaps of changed routes and the others;
	// ModelRoute writes, with those of the routes nobody changed.
	CMWrites          spread       `json:"configMapWritesPerConfigMap"`
	CMWritesChanged   int          `json:"configMapWritesOfChangedRoutesConfigMaps"`
	CMWritesUnchanged int          `json:"configMapWritesOfOtherConfigMaps"`
	Routes            *routeWrites `json:"modelRouteWrites"`
	Watch             watchStats   `json:"configMapWatch"`
	API               *apiDelta    `json:"apiserverRequestsNotOurs,omitempty"`

	// NewLeaderRSSKiB and NewLeaderHWMKiB: the new leader's VmRSS and
	// VmHWM at the end of the phase.
	NewLeaderRSSKiB int64 `json:"newLeaderRSSKiB"`
	NewLeaderHWMKiB int64 `json:"newLeaderVmHWMKiB"`
}

// takeover kills the leader, moves one pod of -takeover-routes routes,
// and measures the standby's takeover until every key is current.
func (b *bench) takeover(ctx context.Context, cl *cluster, w *world, leader, standby *proc, smp *sampler, leases *leaseWatcher, leaderID string,
	phase *phaseVar, watcher, routeWatcher *objWatcher, cmNames []string, res *result) error {
	o, l, tr := b.o, w.l, res.Takeover
	if lease, err := cl.cs.CoordinationV1().Leases(leaseNamespace).Get(ctx, leaderElectionID, metav1.GetOptions{}); err == nil && lease.Spec.LeaseDurationSeconds != nil {
		tr.LeaseDurationSeconds = *lease.Spec.LeaseDurationSeconds
	}
	// The old leader's memory, at the end of its tenure.
	rss, hwm, err := procmem.Read(leader.PID())
	if err != nil {
		return err
	}
	smp.stop()
	smp.mu.Lock()
	res.Memory.RSSEndKiB, res.Memory.HWMKiB = rss, hwm
	res.Memory.MaxSampledKiB, res.Memory.Samples = max(smp.all, rss), smp.n
	smp.mu.Unlock()
	if tr.StandbyRSSKiB, _, err = procmem.Read(standby.PID()); err != nil {
		return err
	}
	cpu0, err := procCPU(standby.PID())
	if err != nil {
		return err
	}

	// The change: the first pod of k routes spread over all of them.
	k := min(o.TakeoverRoutes, l.routes)
	var pods []int
	changedRoute, changedCM := map[string]bool{}, map[string]bool{}
	for _, r := range spreadRoutes(l.routes, k) {
		start, _ := l.podRange(r)
		pods = append(pods, start)
		changedRoute[l.routeNS(r)+"/"+l.routeName(r)] = true
		changedCM[l.cmName(l.cmOf(r))] = true
	}
	tr.ChangedRoutes = k

	api0 := markAPI(ctx, cl)
	phase.set("takeover")
	killAt := time.Now()
	leader.Kill()
	b.logf("takeover: SIGKILL to the leader (pid %d); moving one pod of %d routes", leader.PID(), k)
	last, podW, sliceW, err := b.move(ctx, cl, w, pods)
	if err != nil {
		return fmt.Errorf("takeover change: %w", err)
	}
	tr.PodStatusWrites, tr.SliceWrites, tr.WriteSeconds = podW, sliceW, last.Sub(killAt).Seconds()
	newID, acqAt, err := leases.waitHolder(ctx, leaderID, o.Timeout, func() error { return exitErr(standby) })
	if err != nil {
		return fmt.Errorf("takeover: %w", err)
	}
	tr.AcquireSeconds = acqAt.Sub(killAt).Seconds()
	b.logf("takeover: the standby holds the Lease %.2fs after the kill (%s)", tr.AcquireSeconds, newID)
	convAt, err := b.waitConverged(ctx, cl, l, w.expectations(), standby, "takeover")
	if err != nil {
		return err
	}
	tr.ConvergeSeconds = convAt.Sub(acqAt).Seconds()
	tr.TotalSeconds = convAt.Sub(killAt).Seconds()
	cpu1, err := procCPU(standby.PID())
	if err != nil {
		return err
	}
	tr.CPUSeconds = cpu1 - cpu0
	if _, err := b.waitRoutesReady(ctx, cl, l.routes, standby, "takeover"); err != nil {
		return err
	}
	b.logf("takeover: every key current %.2fs after the acquisition, %.2fs after the kill (new leader CPU %.1fs)", tr.ConvergeSeconds, tr.TotalSeconds, tr.CPUSeconds)
	sleep(ctx, o.Settle)
	cpu2, err := procCPU(standby.PID())
	if err != nil {
		return err
	}
	tr.CPUSecondsSettled = cpu2 - cpu0
	phase.set("done")
	tr.API = deltaAPI(api0, markAPI(ctx, cl))
	tr.Watch = watcher.get("takeover")
	tr.CMWrites = spreadOf(tr.Watch.Modified, cmNames)
	for name, n := range tr.Watch.Modified {
		if changedCM[name] {
			tr.CMWritesChanged += n
		} else {
			tr.CMWritesUnchanged += n
		}
	}
	tr.Routes = routeWritesOf(routeWatcher.get("takeover"), changedRoute)
	if tr.NewLeaderRSSKiB, tr.NewLeaderHWMKiB, err = procmem.Read(standby.PID()); err != nil {
		return err
	}
	b.logf("takeover writes: ConfigMaps %d (%d into the %d ConfigMaps of changed routes, %d into others), ModelRoutes %d (status %d; routes not changed: %d writes, %d status)",
		tr.CMWrites.Total, tr.CMWritesChanged, len(changedCM), tr.CMWritesUnchanged, tr.Routes.Total, tr.Routes.Status, tr.Routes.UnchangedTotal, tr.Routes.UnchangedStatus)
	return nil
}

// routeWrites are ModelRoute writes (resourceVersion changes seen by the
// route watcher) in a phase.
type routeWrites struct {
	Total int `json:"total"`
	// Status changed the route's status; Other did not (finalizer,
	// annotations).
	Status      int `json:"status"`
	Other       int `json:"other"`
	MaxPerRoute int `json:"maxPerRoute"`
	// UnchangedTotal and UnchangedStatus are the writes of the routes
	// outside the changed set (takeover only).
	UnchangedTotal  int `json:"unchangedRoutesTotal"`
	UnchangedStatus int `json:"unchangedRoutesStatus"`
}

func routeWritesOf(ws watchStats, changed map[string]bool) *routeWrites {
	rw := &routeWrites{}
	for k, n := range ws.Modified {
		st := ws.StatusModified[k]
		rw.Total += n
		rw.Status += st
		rw.MaxPerRoute = max(rw.MaxPerRoute, n)
		if changed != nil && !changed[k] {
			rw.UnchangedTotal += n
			rw.UnchangedStatus += st
		}
	}
	rw.Other = rw.Total - rw.Status
	return rw
}

// spreadRoutes picks k of n routes spread over all of them and, as route
// r writes into ConfigMap r mod C and namespace r mod N, over the
// ConfigMaps and namespaces too: the j-th is j·(n/k) + j, or the next
// route not yet taken.
func spreadRoutes(n, k int) []int {
	taken := map[int]bool{}
	var out []int
	for j := 0; j < k; j++ {
		r := (j*(n/k) + j) % n
		for taken[r] {
			r = (r + 1) % n
		}
		taken[r] = true
		out = append(out, r)
	}
	return out
}
