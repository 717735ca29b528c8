package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/modelsphere/autoconfig/hack/scale/procmem"
)

// result is one run's numbers.
type result struct {
	Shape       shape   `json:"shape"`
	Pods        int     `json:"pods"`
	Nodes       int     `json:"nodes"`
	Namespaces  int     `json:"namespaces"`
	Error       string  `json:"error,omitempty"`
	WallSeconds float64 `json:"wallSeconds"`

	// SelectorRoutes discover their pods by selector (-selector-share).
	SelectorRoutes int `json:"selectorRoutes"`
	// Mode is rollout, or takeover (-takeover: no rollout).
	Mode string `json:"mode"`

	Setup    setupTimes      `json:"setup"`
	Sync     phaseResult     `json:"initialSync"`
	Cold     coldStart       `json:"coldStart"`
	Rollout  rolloutResult   `json:"rollout"`
	Takeover *takeoverResult `json:"takeover,omitempty"`
	Memory   memResult       `json:"memory"`
	Floor    *floorResult    `json:"floor,omitempty"`
	// RatioAfterSync is the controller's VmRSS after the initial sync
	// over the floor's VmRSS; RatioPeak is VmHWM over VmHWM.
	RatioAfterSync float64 `json:"rssRatioAfterSync,omitempty"`
	RatioPeak      float64 `json:"rssRatioPeak,omitempty"`
	// FloorPods is the floor with pod informers of the selector routes'
	// namespaces besides the EndpointSlices (selector routes only), and
	// the ratios to it.
	FloorPods          *floorResult `json:"floorWithPods,omitempty"`
	RatioAfterSyncPods float64      `json:"rssRatioAfterSyncToFloorWithPods,omitempty"`
	RatioPeakPods      float64      `json:"rssRatioPeakToFloorWithPods,omitempty"`
}

// coldStart is the initial sync from the controller's start until every
// route is served and says so.
type coldStart struct {
	// Seconds is the later of the two below.
	Seconds float64 `json:"seconds"`
	// ConfigMapsSeconds: until every key holds its route's endpoints
	// (= initialSync.seconds).
	ConfigMapsSeconds float64 `json:"configMapsCurrentSeconds"`
	// RoutesReadySeconds: until a list of the routes showed every one
	// Ready for its generation (polled after the ConfigMaps converged).
	RoutesReadySeconds float64 `json:"routesReadySeconds"`
}

// phaseResult is the initial sync or the rollout.
type phaseResult struct {
	// Seconds: the initial sync from the controller's start, the
	// rollout from its last EndpointSlice write, to the poll that saw
	// every ConfigMap converged.
	Seconds float64 `json:"seconds"`
	// CPUSeconds is the controller's user+system CPU over the phase,
	// until convergence; CPUSecondsSettled until convergence + -settle.
	CPUSeconds        float64 `json:"cpuSeconds"`
	CPUSecondsSettled float64 `json:"cpuSecondsSettled"`
	// MaxRSSKiB is the largest VmRSS sampled in the phase.
	MaxRSSKiB int64 `json:"maxSampledRSSKiB"`
	// Watch is what one watcher of all the ConfigMaps received, from the
	// phase's start until convergence + -settle.
	Watch watchStats `json:"watch"`
	// WritesPerCM summarises Watch.Modified over every ConfigMap (ones
	// not written count as 0).
	WritesPerCM spread `json:"writesPerConfigMap"`
	// API is the requests the API server served in the phase that the
	// benchmark did not send (nil when /metrics could not be read).
	API *apiDelta `json:"apiserverRequestsNotOurs,omitempty"`
	// Routes are the ModelRoute writes of the phase, seen by one watch of
	// every ModelRoute opened before the controller started.
	Routes *routeWrites `json:"modelRouteWrites,omitempty"`
}

type rolloutResult struct {
	phaseResult
	ChangedPods     int `json:"changedPods"`
	PodStatusWrites int `json:"podStatusWrites"`
	SliceWrites     int `json:"endpointSliceWrites"`
	// WriteSeconds is from the first pod write to the last slice write;
	// TotalSeconds from the first pod write to convergence.
	WriteSeconds float64 `json:"writeSeconds"`
	TotalSeconds float64 `json:"totalSeconds"`
}

type spread struct {
	Min   int     `json:"min"`
	Mean  float64 `json:"mean"`
	Max   int     `json:"max"`
	Total int     `json:"total"`
}

type memResult struct {
	// RSSAtSyncKiB is VmRSS when the sync converged; RSSAfterSyncKiB
	// after -settle more.
	RSSAtSyncKiB    int64 `json:"rssAtSyncKiB"`
	RSSAfterSyncKiB int64 `json:"rssAfterSyncKiB"`
	// AnonAfterSyncKiB and FileAfterSyncKiB split RSSAfterSyncKiB:
	// RssAnon (heap, stacks, runtime) and RssFile (mostly the binary's
	// code and read-only data).
	AnonAfterSyncKiB int64 `json:"rssAnonAfterSyncKiB"`
	FileAfterSyncKiB int64 `json:"rssFileAfterSyncKiB"`
	// RSSEndKiB is VmRSS after the rollout settled.
	RSSEndKiB int64 `json:"rssEndKiB"`
	// HWMKiB is VmHWM (peak RSS) at the end of the run.
	HWMKiB int64 `json:"vmHWMKiB"`
	// MaxSampledKiB is the largest VmRSS of the samples; Samples how many.
	MaxSampledKiB int64 `json:"maxSampledRSSKiB"`
	Samples       int   `json:"samples"`
}

func spreadOf(m map[string]int, names []string) spread {
	var s spread
	if len(names) == 0 {
		return s
	}
	s.Min = -1
	for _, n := range names {
		v := m[n]
		s.Total += v
		s.Max = max(s.Max, v)
		if s.Min < 0 || v < s.Min {
			s.Min = v
		}
	}
	s.Mean = float64(s.Total) / float64(len(names))
	return s
}

func since(t time.Time) float64 { return time.Since(t).Seconds() }

func writeFile(path string, b []byte) error { return os.WriteFile(path, b, 0o600) }

// runOne measures one shape on a fresh control plane.
func (b *bench) runOne(ctx context.Context, s shape, dir string) (res *result) {
	o := b.o
	l := layout{routes: s.Routes, cms: s.ConfigMaps, pods: o.Pods, nodes: o.Nodes, nss: o.Namespaces,
		sliceSize: o.SliceSize, rolloutPct: o.RolloutPercent, modelType: o.ModelType, selRoutes: selectorRoutes(o.SelectorShare, s.Routes)}
	res = &result{Shape: s, Pods: o.Pods, Nodes: o.Nodes, Namespaces: min(o.Namespaces, s.Routes), SelectorRoutes: l.selRoutes, Mode: "rollout"}
	if o.Takeover {
		res.Mode = "takeover"
	}
	start := time.Now()
	defer func() { res.WallSeconds = since(start) }()
	fail := func(err error) *result {
		res.Error = err.Error()
		return res
	}

	b.logf("starting the control plane")
	cl, err := b.startCluster(dir)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err := cl.stop(); err != nil {
			b.logf("stop control plane: %v", err)
		}
	}()
	res.Setup.ControlPlane = since(start)
	b.logf("creating the cluster shape (%d of %d routes discover by selector)", l.selRoutes, l.routes)
	w, err := b.setup(ctx, cl, l, &res.Setup)
	if err != nil {
		return fail(err)
	}
	b.logf("setup done in %.1fs (%d objects, %d requests)", res.Setup.Total, res.Setup.Objects, res.Setup.Requests)
	var cmNames []string
	for c := 0; c < l.cms; c++ {
		cmNames = append(cmNames, l.cmName(c))
	}

	// One watcher of every ConfigMap and one of every ModelRoute, opened
	// before the controller.
	phase := &phaseVar{}
	phase.set("setup")
	list, err := cl.csJSON.CoreV1().ConfigMaps(cmNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fail(fmt.Errorf("list configmaps: %w", err))
	}
	watcher := newCMWatcher(phase, cl.csJSON, cmNamespace, list.ResourceVersion)
	routeRV, err := listRV(ctx, cl, modelRoutesPath)
	if err != nil {
		return fail(err)
	}
	routeWatcher := newRouteWatcher(phase, cl.csJSON, routeRV)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go watcher.run(wctx)
	go routeWatcher.run(wctx)
	var leases *leaseWatcher
	if o.Takeover {
		leases = newLeaseWatcher()
		go leases.run(wctx, cl.csJSON, leaseNamespace, leaderElectionID) // no client timeout: a long watch
	}

	// The controller, started after the cluster exists.
	args := []string{"controller", "--kubeconfig", cl.kubeconfig, "--metrics-bind-address", "0", "--health-probe-bind-address", "0"}
	if o.Takeover {
		args = append(args, takeoverArgs...)
	}
	var pprofAddr string
	if o.Profile {
		if pprofAddr, err = freeAddr(); err != nil {
			return fail(err)
		}
	}
	args = append(args, strings.Fields(o.ControllerFlags)...)
	withPprof := args
	if pprofAddr != "" {
		withPprof = append(slices.Clone(args), "--pprof-bind-address", pprofAddr)
	}
	api0 := markAPI(ctx, cl)
	phase.set("sync")
	t0 := time.Now()
	ctrl, err := startProc("controller", filepath.Join(dir, "controller.log"), b.ctrl, withPprof...)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err := ctrl.stop(); err != nil {
			b.logf("%v", err)
		}
	}()
	b.logf("started %s %s (pid %d)", b.ctrl, strings.Join(withPprof, " "), ctrl.PID())
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	smp := &sampler{cancel: scancel, pid: ctrl.PID(), phase: phase, max: map[string]int64{}}
	go smp.run(sctx, o.Sample)

	// -takeover: the second replica starts once the first holds the
	// Lease, so the first is the leader whose sync is measured.
	var standby *proc
	var leaderID string
	if o.Takeover {
		id, at, err := leases.waitHolder(ctx, "", o.Timeout, func() error { return exitErr(ctrl) })
		if err != nil {
			return fail(fmt.Errorf("first replica: %w", err))
		}
		leaderID = id
		res.Takeover = &takeoverResult{FirstLeaseSeconds: at.Sub(t0).Seconds()}
		b.logf("the first replica holds the Lease %s/%s after %.2fs (%s)", leaseNamespace, leaderElectionID, res.Takeover.FirstLeaseSeconds, id)
		if standby, err = startProc("controller-2", filepath.Join(dir, "controller-2.log"), b.ctrl, args...); err != nil {
			return fail(err)
		}
		defer func() {
			if err := standby.stop(); err != nil {
				b.logf("%v", err)
			}
		}()
		b.logf("started the standby replica (pid %d)", standby.PID())
	}

	// Initial sync: every ConfigMap current, then every route Ready.
	syncAt, err := b.waitConverged(ctx, cl, l, w.expectations(), ctrl, "initial sync")
	if err != nil {
		return fail(err)
	}
	res.Sync.Seconds = syncAt.Sub(t0).Seconds()
	if res.Sync.CPUSeconds, err = procCPU(ctrl.PID()); err != nil {
		return fail(err)
	}
	if res.Memory.RSSAtSyncKiB, _, err = procmem.Read(ctrl.PID()); err != nil {
		return fail(err)
	}
	b.logf("initial sync: every ConfigMap current after %.2fs (controller CPU %.1fs)", res.Sync.Seconds, res.Sync.CPUSeconds)
	readyAt, err := b.waitRoutesReady(ctx, cl, l.routes, ctrl, "initial sync")
	if err != nil {
		return fail(err)
	}
	res.Cold = coldStart{ConfigMapsSeconds: res.Sync.Seconds, RoutesReadySeconds: readyAt.Sub(t0).Seconds()}
	res.Cold.Seconds = max(res.Cold.ConfigMapsSeconds, res.Cold.RoutesReadySeconds)
	b.logf("cold start: every route Ready after %.2fs", res.Cold.RoutesReadySeconds)
	sleep(ctx, o.Settle)
	if res.Sync.CPUSecondsSettled, err = procCPU(ctrl.PID()); err != nil {
		return fail(err)
	}
	if res.Memory.RSSAfterSyncKiB, _, err = procmem.Read(ctrl.PID()); err != nil {
		return fail(err)
	}
	if res.Memory.AnonAfterSyncKiB, res.Memory.FileAfterSyncKiB, err = procmem.Split(ctrl.PID()); err != nil {
		return fail(err)
	}
	if pprofAddr != "" {
		b.saveHeap(ctx, pprofAddr, filepath.Join(dir, "heap-after-sync.pb.gz"))
	}
	phase.set("idle")
	api1 := markAPI(ctx, cl)
	res.Sync.API = deltaAPI(api0, api1)
	res.Sync.MaxRSSKiB = smp.maxOf("sync")
	res.Sync.Watch = watcher.get("sync")
	res.Sync.WritesPerCM = spreadOf(res.Sync.Watch.Modified, cmNames)
	res.Sync.Routes = routeWritesOf(routeWatcher.get("sync"), nil)
	b.logf("sync writes: ConfigMaps %d (max %d per ConfigMap), ModelRoutes %d (%d of them status), watch %.1f MiB",
		res.Sync.WritesPerCM.Total, res.Sync.WritesPerCM.Max, res.Sync.Routes.Total, res.Sync.Routes.Status, float64(res.Sync.Watch.Bytes)/(1<<20))

	if o.Takeover {
		if err := b.takeover(ctx, cl, w, ctrl, standby, smp, leases, leaderID, phase, watcher, routeWatcher, cmNames, res); err != nil {
			return fail(err)
		}
	} else if err := b.rolloutPhase(ctx, cl, w, ctrl, smp, phase, watcher, routeWatcher, cmNames, pprofAddr, dir, res); err != nil {
		return fail(err)
	}
	if err := errors.Join(watcher.failed(), routeWatcher.failed()); err != nil {
		return fail(err)
	}
	if standby != nil {
		if err := standby.stop(); err != nil {
			b.logf("%v", err)
		}
	}

	// The floor: a bare EndpointSlice informer in its own process; with
	// selector routes also one with pod informers of their namespaces.
	fr, err := b.runFloor(ctx, cl.kubeconfig, dir, nil)
	if err != nil {
		return fail(err)
	}
	res.Floor = fr
	res.RatioAfterSync = float64(res.Memory.RSSAfterSyncKiB) / float64(fr.RSSKiB)
	res.RatioPeak = float64(res.Memory.HWMKiB) / float64(fr.HWMKiB)
	b.logf("floor: %d EndpointSlices cached, VmRSS %s (anon %s, file %s), VmHWM %s; controller VmRSS after sync %s (anon %s, file %s; %.1f×), VmHWM %s",
		fr.Slices, mib(fr.RSSKiB), mib(fr.AnonKiB), mib(fr.FileKiB), mib(fr.HWMKiB),
		mib(res.Memory.RSSAfterSyncKiB), mib(res.Memory.AnonAfterSyncKiB), mib(res.Memory.FileAfterSyncKiB), res.RatioAfterSync, mib(res.Memory.HWMKiB))
	if nss := l.selectorNamespaces(); len(nss) > 0 {
		fp, err := b.runFloor(ctx, cl.kubeconfig, dir, nss)
		if err != nil {
			return fail(err)
		}
		res.FloorPods = fp
		res.RatioAfterSyncPods = float64(res.Memory.RSSAfterSyncKiB) / float64(fp.RSSKiB)
		res.RatioPeakPods = float64(res.Memory.HWMKiB) / float64(fp.HWMKiB)
		b.logf("floor with pods: %d EndpointSlices and %d pods of %d namespaces cached, VmRSS %s, VmHWM %s; controller %.1f× after sync, %.1f× peak",
			fp.Slices, fp.Pods, len(nss), mib(fp.RSSKiB), mib(fp.HWMKiB), res.RatioAfterSyncPods, res.RatioPeakPods)
	}
	return res
}

// selectorRoutes is the number of routes -selector-share makes selector
// routes.
func selectorRoutes(share float64, routes int) int {
	return min(routes, int(math.Round(share*float64(routes))))
}

// listRV is the resourceVersion of a collection (for a watch from now).
func listRV(ctx context.Context, cl *cluster, path string) (string, error) {
	b, err := cl.csJSON.CoreV1().RESTClient().Get().AbsPath(path).Param("limit", "1").DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("list %s: %w", path, err)
	}
	var l struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return "", fmt.Errorf("list %s: %w", path, err)
	}
	return l.Metadata.ResourceVersion, nil
}

func exitErr(p *proc) error {
	if p.Exited() {
		return fmt.Errorf("%s exited%s", p.Name, p.tail())
	}
	return nil
}

// rolloutPhase measures the rollout and the controller's memory at the
// end, then stops the controller.
func (b *bench) rolloutPhase(ctx context.Context, cl *cluster, w *world, ctrl *proc, smp *sampler, phase *phaseVar,
	watcher, routeWatcher *objWatcher, cmNames []string, pprofAddr, dir string, res *result) error {
	o, l := b.o, w.l
	cpu0, err := procCPU(ctrl.PID())
	if err != nil {
		return err
	}
	api2 := markAPI(ctx, cl)
	phase.set("rollout")
	first := time.Now()
	last, err := b.rollout(ctx, cl, w, &res.Rollout)
	if err != nil {
		return err
	}
	res.Rollout.WriteSeconds = last.Sub(first).Seconds()
	b.logf("rollout: %d pod IPs changed, %d pod status and %d EndpointSlice writes in %.2fs", res.Rollout.ChangedPods, res.Rollout.PodStatusWrites, res.Rollout.SliceWrites, res.Rollout.WriteSeconds)
	convAt, err := b.waitConverged(ctx, cl, l, w.expectations(), ctrl, "rollout")
	if err != nil {
		return err
	}
	res.Rollout.Seconds = max(0, convAt.Sub(last).Seconds())
	res.Rollout.TotalSeconds = convAt.Sub(first).Seconds()
	cpu1, err := procCPU(ctrl.PID())
	if err != nil {
		return err
	}
	res.Rollout.CPUSeconds = cpu1 - cpu0
	b.logf("rollout converged %.2fs after the last write (controller CPU %.1fs)", res.Rollout.Seconds, res.Rollout.CPUSeconds)
	sleep(ctx, o.Settle)
	cpu2, err := procCPU(ctrl.PID())
	if err != nil {
		return err
	}
	res.Rollout.CPUSecondsSettled = cpu2 - cpu0
	phase.set("done")
	api3 := markAPI(ctx, cl)
	res.Rollout.API = deltaAPI(api2, api3)
	res.Rollout.MaxRSSKiB = smp.maxOf("rollout")
	res.Rollout.Watch = watcher.get("rollout")
	res.Rollout.WritesPerCM = spreadOf(res.Rollout.Watch.Modified, cmNames)
	res.Rollout.Routes = routeWritesOf(routeWatcher.get("rollout"), nil)

	rss, hwm, err := procmem.Read(ctrl.PID())
	if err != nil {
		return err
	}
	smp.stop()
	smp.mu.Lock()
	res.Memory.RSSEndKiB, res.Memory.HWMKiB = rss, hwm
	if pprofAddr != "" {
		b.saveHeap(ctx, pprofAddr, filepath.Join(dir, "heap-after-rollout.pb.gz"))
	}
	res.Memory.MaxSampledKiB, res.Memory.Samples = max(smp.all, rss), smp.n
	smp.mu.Unlock()
	if err := ctrl.stop(); err != nil {
		b.logf("%v", err)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// rollout changes the IP of -rollout-percent of every route's pods (see
// move). It returns when the last write returned.
func (b *bench) rollout(ctx context.Context, cl *cluster, w *world, rr *rolloutResult) (time.Time, error) {
	l := w.l
	var pods []int
	for r := 0; r < l.routes; r++ {
		start, end := l.podRange(r)
		for i := start; i < end; i++ {
			if l.changed(i - start) {
				pods = append(pods, i)
			}
		}
	}
	rr.ChangedPods = len(pods)
	last, podW, sliceW, err := b.move(ctx, cl, w, pods)
	rr.PodStatusWrites, rr.SliceWrites = podW, sliceW
	if err != nil {
		return time.Time{}, fmt.Errorf("rollout: %w", err)
	}
	return last, nil
}

// move gives the pods a new IP: the pods' status first (as the kubelet of
// a replacement pod would report it), then every EndpointSlice holding one
// of them, one update per slice, as the EndpointSlice controller would
// (selector routes have none: their pods' status is the change). It
// returns when the last write returned, and the writes made.
func (b *bench) move(ctx context.Context, cl *cluster, w *world, pods []int) (last time.Time, podWrites, sliceWrites int, err error) {
	l := w.l
	touched := map[int][]int{} // route → slice indexes
	for _, i := range pods {
		w.gen[i]++
		r := l.routeOf(i)
		if l.selector(r) {
			continue
		}
		start, _ := l.podRange(r)
		s := (i - start) / l.sliceSize
		if ts := touched[r]; !slices.Contains(ts, s) {
			touched[r] = append(touched[r], s)
		}
	}
	err = parallel(ctx, b.o.Workers, len(pods), func(ctx context.Context, k int) error {
		i := pods[k]
		ip := podIP(w.gen[i], i)
		patch, _ := json.Marshal(map[string]any{"status": map[string]any{"podIP": ip, "podIPs": []map[string]string{{"ip": ip}}}})
		return retry(ctx, "pod status "+l.podName(i), func() error {
			_, err := cl.cs.CoreV1().Pods(l.routeNS(l.routeOf(i))).Patch(ctx, l.podName(i), types.MergePatchType, patch, metav1.PatchOptions{}, "status")
			return err
		})
	})
	if err != nil {
		return time.Time{}, 0, 0, err
	}
	podWrites = len(pods)
	type sliceRef struct{ r, s int }
	var refs []sliceRef
	for r, ss := range touched {
		for _, s := range ss {
			refs = append(refs, sliceRef{r, s})
		}
	}
	sort.Slice(refs, func(a, c int) bool {
		if refs[a].r != refs[c].r {
			return refs[a].r < refs[c].r
		}
		return refs[a].s < refs[c].s
	})
	desired := map[int][]*discoveryv1.EndpointSlice{}
	for r := range touched {
		desired[r] = w.desiredSlices(r)
	}
	err = parallel(ctx, b.o.Workers, len(refs), func(ctx context.Context, k int) error {
		ref := refs[k]
		cur := w.slices[ref.r][ref.s].DeepCopy()
		want := desired[ref.r][ref.s]
		return retry(ctx, "endpointslice "+cur.Name, func() error {
			cur.Endpoints = want.Endpoints
			cur.Annotations = want.Annotations
			got, err := cl.cs.DiscoveryV1().EndpointSlices(cur.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
			if apierrors.IsConflict(err) {
				if fresh, gerr := cl.cs.DiscoveryV1().EndpointSlices(cur.Namespace).Get(ctx, cur.Name, metav1.GetOptions{}); gerr == nil {
					cur = fresh
				}
				return err
			}
			if err == nil {
				w.slices[ref.r][ref.s] = got
			}
			return err
		})
	})
	last = time.Now()
	if err != nil {
		return time.Time{}, podWrites, 0, err
	}
	return last, podWrites, len(refs), nil
}

// floorResult is the floor program's report (hack/scale/floor).
type floorResult struct {
	RSSKiB      int64   `json:"vmRSSKiB"`
	AnonKiB     int64   `json:"rssAnonKiB"`
	FileKiB     int64   `json:"rssFileKiB"`
	HWMKiB      int64   `json:"vmHWMKiB"`
	Slices      int     `json:"endpointSlices"`
	Pods        int     `json:"pods,omitempty"`
	SyncSeconds float64 `json:"syncSeconds"`
}

// runFloor runs the floor program against the run's cluster and reads its
// report; with podNamespaces it also caches the pods of those namespaces.
func (b *bench) runFloor(ctx context.Context, kubeconfig, dir string, podNamespaces []string) (*floorResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	logPath := filepath.Join(dir, "floor.log")
	args := []string{"--kubeconfig", kubeconfig}
	if len(podNamespaces) > 0 {
		logPath = filepath.Join(dir, "floor-pods.log")
		args = append(args, "--pod-namespaces", strings.Join(podNamespaces, ","))
	}
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, b.floor, args...)
	cmd.Stderr = f
	out, err := cmd.Output()
	if err != nil {
		tail, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("floor process: %w\n%s", err, tail)
	}
	var fr floorResult
	if err := json.Unmarshal(out, &fr); err != nil {
		return nil, fmt.Errorf("floor process output %q: %w", out, err)
	}
	if fr.RSSKiB <= 0 || fr.HWMKiB <= 0 {
		return nil, fmt.Errorf("floor process reported no memory: %s", out)
	}
	return &fr, nil
}

func mib(kib int64) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }

// freeAddr is a free localhost TCP address.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// saveHeap saves the controller's heap profile (after a GC) to path; a
// failure is logged, the run goes on.
func (b *bench) saveHeap(ctx context.Context, addr, path string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/debug/pprof/heap?gc=1", nil)
	if err == nil {
		var resp *http.Response
		if resp, err = http.DefaultClient.Do(req); err == nil {
			defer resp.Body.Close()
			var f *os.File
			if f, err = os.Create(path); err == nil {
				_, err = io.Copy(f, resp.Body)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
		}
	}
	if err != nil {
		b.logf("heap profile: %v", err)
		return
	}
	b.logf("heap profile saved to %s (go tool pprof %s)", path, path)
}
