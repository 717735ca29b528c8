package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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

	Setup   setupTimes    `json:"setup"`
	Sync    phaseResult   `json:"initialSync"`
	Rollout rolloutResult `json:"rollout"`
	Memory  memResult     `json:"memory"`
	Floor   *floorResult  `json:"floor,omitempty"`
	// RatioAfterSync is the controller's VmRSS after the initial sync
	// over the floor's VmRSS; RatioPeak is VmHWM over VmHWM.
	RatioAfterSync float64 `json:"rssRatioAfterSync,omitempty"`
	RatioPeak      float64 `json:"rssRatioPeak,omitempty"`
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
	res = &result{Shape: s, Pods: o.Pods, Nodes: o.Nodes, Namespaces: min(o.Namespaces, s.Routes)}
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
	l := layout{routes: s.Routes, cms: s.ConfigMaps, pods: o.Pods, nodes: o.Nodes, nss: o.Namespaces,
		sliceSize: o.SliceSize, rolloutPct: o.RolloutPercent, modelType: o.ModelType}
	b.logf("creating the cluster shape")
	w, err := b.setup(ctx, cl, l, &res.Setup)
	if err != nil {
		return fail(err)
	}
	b.logf("setup done in %.1fs (%d objects, %d requests)", res.Setup.Total, res.Setup.Objects, res.Setup.Requests)
	var cmNames []string
	for c := 0; c < l.cms; c++ {
		cmNames = append(cmNames, l.cmName(c))
	}

	// One watcher of every ConfigMap, opened before the controller.
	phase := &phaseVar{}
	phase.set("setup")
	list, err := cl.csJSON.CoreV1().ConfigMaps(cmNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fail(fmt.Errorf("list configmaps: %w", err))
	}
	watcher := newWatcher(phase, list.ResourceVersion)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go watcher.run(wctx, cl.csJSON, cmNamespace)

	// The controller, started after the cluster exists.
	args := []string{"controller", "--kubeconfig", cl.kubeconfig, "--metrics-bind-address", "0", "--health-probe-bind-address", "0"}
	var pprofAddr string
	if o.Profile {
		if pprofAddr, err = freeAddr(); err != nil {
			return fail(err)
		}
		args = append(args, "--pprof-bind-address", pprofAddr)
	}
	args = append(args, strings.Fields(o.ControllerFlags)...)
	api0 := markAPI(ctx, cl)
	phase.set("sync")
	t0 := time.Now()
	ctrl, err := startProc("controller", filepath.Join(dir, "controller.log"), b.ctrl, args...)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err := ctrl.stop(); err != nil {
			b.logf("%v", err)
		}
	}()
	b.logf("started %s %s (pid %d)", b.ctrl, strings.Join(args, " "), ctrl.pid())
	smp := &sampler{pid: ctrl.pid(), phase: phase, max: map[string]int64{}}
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	go smp.run(sctx, o.Sample)

	// Initial sync.
	syncAt, err := b.waitConverged(ctx, cl, l, w.expectations(), ctrl, "initial sync")
	if err != nil {
		return fail(err)
	}
	res.Sync.Seconds = syncAt.Sub(t0).Seconds()
	if res.Sync.CPUSeconds, err = procCPU(ctrl.pid()); err != nil {
		return fail(err)
	}
	if res.Memory.RSSAtSyncKiB, _, err = procmem.Read(ctrl.pid()); err != nil {
		return fail(err)
	}
	b.logf("initial sync converged in %.2fs (controller CPU %.1fs)", res.Sync.Seconds, res.Sync.CPUSeconds)
	sleep(ctx, o.Settle)
	if res.Sync.CPUSecondsSettled, err = procCPU(ctrl.pid()); err != nil {
		return fail(err)
	}
	if res.Memory.RSSAfterSyncKiB, _, err = procmem.Read(ctrl.pid()); err != nil {
		return fail(err)
	}
	if res.Memory.AnonAfterSyncKiB, res.Memory.FileAfterSyncKiB, err = procmem.Split(ctrl.pid()); err != nil {
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

	// Rollout.
	cpu0, err := procCPU(ctrl.pid())
	if err != nil {
		return fail(err)
	}
	api2 := markAPI(ctx, cl)
	phase.set("rollout")
	first := time.Now()
	last, err := b.rollout(ctx, cl, w, &res.Rollout)
	if err != nil {
		return fail(err)
	}
	res.Rollout.WriteSeconds = last.Sub(first).Seconds()
	b.logf("rollout: %d pod IPs changed, %d pod status and %d EndpointSlice writes in %.2fs", res.Rollout.ChangedPods, res.Rollout.PodStatusWrites, res.Rollout.SliceWrites, res.Rollout.WriteSeconds)
	convAt, err := b.waitConverged(ctx, cl, l, w.expectations(), ctrl, "rollout")
	if err != nil {
		return fail(err)
	}
	res.Rollout.Seconds = max(0, convAt.Sub(last).Seconds())
	res.Rollout.TotalSeconds = convAt.Sub(first).Seconds()
	cpu1, err := procCPU(ctrl.pid())
	if err != nil {
		return fail(err)
	}
	res.Rollout.CPUSeconds = cpu1 - cpu0
	b.logf("rollout converged %.2fs after the last EndpointSlice write (controller CPU %.1fs)", res.Rollout.Seconds, res.Rollout.CPUSeconds)
	sleep(ctx, o.Settle)
	cpu2, err := procCPU(ctrl.pid())
	if err != nil {
		return fail(err)
	}
	res.Rollout.CPUSecondsSettled = cpu2 - cpu0
	phase.set("done")
	api3 := markAPI(ctx, cl)
	res.Rollout.API = deltaAPI(api2, api3)
	res.Rollout.MaxRSSKiB = smp.maxOf("rollout")
	res.Rollout.Watch = watcher.get("rollout")
	res.Rollout.WritesPerCM = spreadOf(res.Rollout.Watch.Modified, cmNames)
	if err := watcher.failed(); err != nil {
		return fail(err)
	}

	rss, hwm, err := procmem.Read(ctrl.pid())
	if err != nil {
		return fail(err)
	}
	scancel()
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

	// The floor: a bare EndpointSlice informer in its own process.
	fr, err := b.runFloor(ctx, cl.kubeconfig, dir)
	if err != nil {
		return fail(err)
	}
	res.Floor = fr
	res.RatioAfterSync = float64(res.Memory.RSSAfterSyncKiB) / float64(fr.RSSKiB)
	res.RatioPeak = float64(res.Memory.HWMKiB) / float64(fr.HWMKiB)
	b.logf("floor: %d EndpointSlices cached, VmRSS %s (anon %s, file %s), VmHWM %s; controller VmRSS after sync %s (anon %s, file %s; %.1f×), VmHWM %s",
		fr.Slices, mib(fr.RSSKiB), mib(fr.AnonKiB), mib(fr.FileKiB), mib(fr.HWMKiB),
		mib(res.Memory.RSSAfterSyncKiB), mib(res.Memory.AnonAfterSyncKiB), mib(res.Memory.FileAfterSyncKiB), res.RatioAfterSync, mib(res.Memory.HWMKiB))
	return res
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// rollout changes the IP of -rollout-percent of every route's pods: the
// pods' status first (as the kubelet of a replacement pod would report
// it), then every EndpointSlice holding one of them, one update per
// slice, as the EndpointSlice controller would. It returns when the last
// slice write returned.
func (b *bench) rollout(ctx context.Context, cl *cluster, w *world, rr *rolloutResult) (time.Time, error) {
	l := w.l
	var pods []int
	touched := map[int][]int{} // route → slice indexes
	for r := 0; r < l.routes; r++ {
		start, end := l.podRange(r)
		for i := start; i < end; i++ {
			if !l.changed(i - start) {
				continue
			}
			pods = append(pods, i)
			w.gen[i]++
			s := (i - start) / l.sliceSize
			if ts := touched[r]; len(ts) == 0 || ts[len(ts)-1] != s {
				touched[r] = append(touched[r], s)
			}
		}
	}
	rr.ChangedPods = len(pods)
	err := parallel(ctx, b.o.Workers, len(pods), func(ctx context.Context, k int) error {
		i := pods[k]
		ip := podIP(w.gen[i], i)
		patch, _ := json.Marshal(map[string]any{"status": map[string]any{"podIP": ip, "podIPs": []map[string]string{{"ip": ip}}}})
		return retry(ctx, "pod status "+l.podName(i), func() error {
			_, err := cl.cs.CoreV1().Pods(l.routeNS(l.routeOf(i))).Patch(ctx, l.podName(i), types.MergePatchType, patch, metav1.PatchOptions{}, "status")
			return err
		})
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("rollout: %w", err)
	}
	rr.PodStatusWrites = len(pods)
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
	last := time.Now()
	if err != nil {
		return time.Time{}, fmt.Errorf("rollout: %w", err)
	}
	rr.SliceWrites = len(refs)
	return last, nil
}

// floorResult is the floor program's report (hack/scale/floor).
type floorResult struct {
	RSSKiB      int64   `json:"vmRSSKiB"`
	AnonKiB     int64   `json:"rssAnonKiB"`
	FileKiB     int64   `json:"rssFileKiB"`
	HWMKiB      int64   `json:"vmHWMKiB"`
	Slices      int     `json:"endpointSlices"`
	SyncSeconds float64 `json:"syncSeconds"`
}

// runFloor runs the floor program against the run's cluster and reads its
// report.
func (b *bench) runFloor(ctx context.Context, kubeconfig, dir string) (*floorResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	logPath := filepath.Join(dir, "floor.log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, b.floor, "--kubeconfig", kubeconfig)
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
