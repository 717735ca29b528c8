// Command scale measures the autoconfig controller at cluster scale on a
// real kube-apiserver + etcd (the envtest binaries of `make envtest`): a
// cluster of 10,000 running pods on 50 GPU nodes, one Service with its
// EndpointSlices per route, R ModelRoutes writing their route files into C
// shared openresty ConfigMaps. The real `autoconfig controller` binary
// runs as a separate process, started after the cluster exists, and the
// benchmark reports its memory (RSS peak and after sync), CPU, initial
// sync time, and, for a rollout that changes 10 % of the pods' IPs, the
// convergence time, the ConfigMap writes and the bytes a ConfigMap watcher
// receives. A bare EndpointSlice informer in a second, small process
// (./hack/scale/floor) is the floor the controller's memory is compared
// with. The cold start is also reported as the time until every route is
// Ready, with the ModelRoute and ConfigMap writes it took.
//
// -selector-share makes a share of the routes discover their pods by
// label selector instead of by Service. -takeover runs two replicas with
// leader election instead of the rollout, kills the leader after the sync
// and measures the standby's takeover: Lease acquisition, convergence of
// a change made right after the kill, and its writes.
//
//	make bench-scale     # or: go run ./hack/scale [flags]
//	go run ./hack/scale -matrix 100x10 -pods 2000   # one small run
//	go run ./hack/scale -matrix 100x10 -pods 2000 -selector-share 0.1
//	go run ./hack/scale -matrix 100x10 -pods 2000 -takeover
//
// Each R×C entry of -matrix runs on a fresh control plane. Results go to
// stdout (a markdown table, then one JSON line per run); progress to
// stderr. The exit status is 1 when any run fails (a wait that does not
// converge within -timeout is a failure), 2 on a usage error.
//
// Not part of `make test`: the default matrix takes about 20 minutes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/internal/testenv"
)

// options are the benchmark's flags.
type options struct {
	Matrix          string
	Pods            int
	Nodes           int
	Namespaces      int
	SliceSize       int
	RolloutPercent  int
	ModelType       string
	Timeout         time.Duration
	Settle          time.Duration
	Poll            time.Duration
	Sample          time.Duration
	Workers         int
	QPS             float64
	Burst           int
	Autoconfig      string
	Rev             string
	ControllerFlags string
	Keep            bool
	EtcdFsync       bool
	Profile         bool
	SelectorShare   float64
	Takeover        bool
	TakeoverRoutes  int

	shapes []shape
}

// shape is one entry of the matrix: routes × output ConfigMaps.
type shape struct {
	Routes     int `json:"routes"`
	ConfigMaps int `json:"configMaps"`
}

func (s shape) String() string { return fmt.Sprintf("%dx%d", s.Routes, s.ConfigMaps) }

// DefaultMatrix is the default set of runs.
const DefaultMatrix = "100x10,1000x10,1000x100"

func (o *options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Matrix, "matrix", DefaultMatrix, "runs as ROUTESxCONFIGMAPS, comma-separated; each on a fresh control plane (a subset, e.g. 100x10, selects runs)")
	fs.IntVar(&o.Pods, "pods", 10000, "pods in the cluster, split evenly over the routes")
	fs.IntVar(&o.Nodes, "nodes", 50, "GPU nodes the pods run on")
	fs.IntVar(&o.Namespaces, "namespaces", 10, "namespaces the routes, their Services and pods are spread over (round robin)")
	fs.IntVar(&o.SliceSize, "slice-size", 100, "endpoints per EndpointSlice at most (the EndpointSlice controller's default)")
	fs.IntVar(&o.RolloutPercent, "rollout-percent", 10, "percentage of the pods whose IP the rollout changes (the same share of every route)")
	fs.StringVar(&o.ModelType, "model-type", "llm", "spec.modelType of the routes: llm or video")
	fs.DurationVar(&o.Timeout, "timeout", 10*time.Minute, "bound of each wait for convergence (initial sync, rollout); a run that does not converge fails")
	fs.DurationVar(&o.Settle, "settle", 3*time.Second, "after convergence, time still counted to the phase (late writes, watch bytes) before the next phase starts")
	fs.DurationVar(&o.Poll, "poll", 250*time.Millisecond, "interval of the ConfigMap GETs that detect convergence")
	fs.DurationVar(&o.Sample, "sample", 200*time.Millisecond, "interval of the controller's VmRSS samples")
	fs.IntVar(&o.Workers, "workers", 32, "parallel workers creating and updating objects")
	fs.Float64Var(&o.QPS, "qps", 500, "client QPS of the benchmark's own clients (setup, rollout, polling)")
	fs.IntVar(&o.Burst, "burst", 1000, "client burst of the benchmark's own clients")
	fs.StringVar(&o.Autoconfig, "autoconfig", "", "use this autoconfig binary instead of building ./cmd/autoconfig from the working tree")
	fs.StringVar(&o.Rev, "rev", "", "build the controller from this commit (exported with git archive; the working tree is not touched) instead of the working tree")
	fs.StringVar(&o.ControllerFlags, "controller-flags", "", "extra flags for the controller command, space-separated, e.g. \"--max-concurrent-reconciles 8\" (default: none, the controller's defaults)")
	fs.BoolVar(&o.Keep, "keep", false, "keep the temporary directory (controller logs, kubeconfig)")
	fs.BoolVar(&o.Profile, "profile", false, "serve the controller's pprof on a local port and save its heap profile after the sync and after the rollout into the run's directory (implies -keep; the controller must have --pprof-bind-address)")
	fs.Float64Var(&o.SelectorShare, "selector-share", 0, "share of the routes (0 to 1) that discover their pods by discovery.selector (their pods' labels; no Service, no EndpointSlices) instead of by Service; the first routes, so they spread over the namespaces and ConfigMaps. The controller then caches the pods of their namespaces: the floor is measured a second time with those pods")
	fs.BoolVar(&o.Takeover, "takeover", false, "instead of the rollout: run two controller replicas with the chart's leader-election flags, and after the initial sync SIGKILL the leader, move one pod of -takeover-routes routes at once, and measure the standby's Lease acquisition, its convergence and its writes")
	fs.IntVar(&o.TakeoverRoutes, "takeover-routes", 10, "with -takeover: routes (spread over all) whose first pod gets a new IP right after the kill")
	fs.BoolVar(&o.EtcdFsync, "etcd-fsync", false, "let etcd fsync its writes (off by default: setup is faster and the controller, not the disk, is measured)")
}

func (o *options) Validate() error {
	var errs []error
	shapes, err := parseMatrix(o.Matrix)
	if err != nil {
		errs = append(errs, err)
	}
	o.shapes = shapes
	if o.Profile {
		o.Keep = true
	}
	for _, s := range shapes {
		if s.Routes > o.Pods {
			errs = append(errs, fmt.Errorf("-matrix %s: more routes than -pods %d (every route needs a pod)", s, o.Pods))
		}
		if s.Routes > 9999 || s.ConfigMaps > 999 {
			errs = append(errs, fmt.Errorf("-matrix %s: at most 9999 routes and 999 ConfigMaps", s))
		}
	}
	if o.Pods < 1 || o.Pods > maxPods {
		errs = append(errs, fmt.Errorf("-pods must be from 1 to %d", maxPods))
	}
	if o.Nodes < 1 || o.Nodes > 200 {
		errs = append(errs, errors.New("-nodes must be from 1 to 200"))
	}
	if o.Namespaces < 1 || o.Namespaces > 99 {
		errs = append(errs, errors.New("-namespaces must be from 1 to 99"))
	}
	if o.SliceSize < 1 || o.SliceSize > 1000 {
		errs = append(errs, errors.New("-slice-size must be from 1 to 1000 (the API server's limit)"))
	}
	if o.RolloutPercent < 1 || o.RolloutPercent > 100 {
		errs = append(errs, errors.New("-rollout-percent must be from 1 to 100"))
	}
	if o.ModelType != "llm" && o.ModelType != "video" {
		errs = append(errs, fmt.Errorf("-model-type %q: use llm or video", o.ModelType))
	}
	if o.Timeout <= 0 || o.Poll <= 0 || o.Sample <= 0 || o.Settle < 0 {
		errs = append(errs, errors.New("-timeout, -poll and -sample must be > 0, -settle >= 0"))
	}
	if o.SelectorShare < 0 || o.SelectorShare > 1 {
		errs = append(errs, errors.New("-selector-share must be from 0 to 1"))
	}
	if o.TakeoverRoutes < 1 {
		errs = append(errs, errors.New("-takeover-routes must be at least 1"))
	}
	if o.Rev != "" && o.Autoconfig != "" {
		errs = append(errs, errors.New("-rev and -autoconfig exclude each other"))
	}
	if o.Workers < 1 || o.QPS <= 0 || o.Burst < 1 {
		errs = append(errs, errors.New("-workers, -qps and -burst must be positive"))
	}
	return errors.Join(errs...)
}

func parseMatrix(s string) ([]shape, error) {
	var out []shape
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		rs, cs, ok := strings.Cut(f, "x")
		r, err1 := strconv.Atoi(rs)
		c, err2 := strconv.Atoi(cs)
		if !ok || err1 != nil || err2 != nil || r < 1 || c < 1 {
			return nil, fmt.Errorf("-matrix entry %q: want ROUTESxCONFIGMAPS, e.g. 1000x10", f)
		}
		out = append(out, shape{Routes: r, ConfigMaps: c})
	}
	if len(out) == 0 {
		return nil, errors.New("-matrix is empty")
	}
	return out, nil
}

func main() { os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr)) }

func runMain(args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./hack/scale [flags]\n\nflags:\n")
		fs.PrintDefaults()
	}
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "scale: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintln(stderr, "scale:", err)
		return 2
	}
	// envtest logs through controller-runtime's logger; the benchmark
	// reports its own progress.
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b, err := newBench(o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "scale:", err)
		return 1
	}
	defer b.cleanup()
	results := b.runAll(ctx)
	writeReport(stdout, b, results)
	failed := 0
	for _, r := range results {
		if r.Error != "" {
			failed++
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "scale: interrupted")
		return 130
	}
	if failed > 0 {
		fmt.Fprintf(stderr, "scale: %d of %d runs failed\n", failed, len(results))
		return 1
	}
	return 0
}

// bench is the state shared by the runs.
type bench struct {
	o      options
	log    io.Writer
	root   string // module root
	tmp    string
	assets string // envtest binaries
	ctrl   string // autoconfig binary
	floor  string // the floor program's binary (./hack/scale/floor)
	// crds is the CRD directory installed in every control plane: the
	// working tree's, or the -rev commit's.
	crds string
	// build describes what was measured (commit, dirty files).
	build buildInfo
}

type buildInfo struct {
	Commit     string   `json:"commit"`
	DirtyFiles []string `json:"dirtyFiles,omitempty"`
	Binary     string   `json:"binary"`
	GoVersion  string   `json:"goVersion"`
	Date       string   `json:"date"`
	Command    string   `json:"command"`
}

func newBench(o options, log io.Writer) (*bench, error) {
	b := &bench{o: o, log: log}
	var err error
	if b.root, err = testbin.ModuleRoot(); err != nil {
		return nil, err
	}
	if b.assets, err = testenv.AssetsDir(); err != nil {
		return nil, err
	}
	if err := checkNeedles(o.ModelType); err != nil {
		return nil, err
	}
	if b.tmp, err = os.MkdirTemp("", "autoconfig-scale-"); err != nil {
		return nil, err
	}
	b.build = b.describe()
	b.crds = filepath.Join(b.root, testenv.CRDDir)
	b.floor = filepath.Join(b.tmp, "floor")
	cmd := exec.Command("go", "build", "-o", b.floor, "./hack/scale/floor")
	cmd.Dir = b.root
	if out, err := cmd.CombinedOutput(); err != nil {
		b.cleanup()
		return nil, fmt.Errorf("go build ./hack/scale/floor: %w\n%s", err, out)
	}
	b.ctrl = o.Autoconfig
	if b.ctrl != "" {
		b.build.Binary = o.Autoconfig
		return b, nil
	}
	if err := b.buildController(); err != nil {
		b.cleanup()
		return nil, err
	}
	return b, nil
}

// buildController builds ./cmd/autoconfig from the working tree, or from
// the commit -rev exported into the temporary directory.
func (b *bench) buildController() error {
	b.ctrl = filepath.Join(b.tmp, "autoconfig")
	src := b.root
	if b.o.Rev != "" {
		commit, err := b.git("rev-parse", "--verify", b.o.Rev+"^{commit}")
		if err != nil {
			return fmt.Errorf("-rev %s: %w", b.o.Rev, err)
		}
		src = filepath.Join(b.tmp, "src")
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		archive := exec.Command("git", "archive", "--format=tar", commit)
		archive.Dir = b.root
		untar := exec.Command("tar", "-x", "-C", src)
		pipe, err := archive.StdoutPipe()
		if err != nil {
			return err
		}
		untar.Stdin = pipe
		if err := untar.Start(); err != nil {
			return err
		}
		if err := archive.Run(); err != nil {
			return fmt.Errorf("git archive %s: %w", commit, err)
		}
		if err := untar.Wait(); err != nil {
			return fmt.Errorf("untar %s: %w", commit, err)
		}
		b.build.Commit, b.build.DirtyFiles = commit, nil
		b.crds = filepath.Join(src, testenv.CRDDir)
		b.build.Binary = "./cmd/autoconfig (-rev " + b.o.Rev + ")"
	} else {
		b.build.Binary = "./cmd/autoconfig (working tree)"
	}
	b.logf("building %s%s", b.build.Binary, dirtyNote(b.build.DirtyFiles))
	cmd := exec.Command("go", "build", "-o", b.ctrl, "./cmd/autoconfig")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/autoconfig in %s: %w\n%s", src, err, out)
	}
	return nil
}

// git runs a read-only git command in the module root.
func (b *bench) git(args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = b.root
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

func (b *bench) cleanup() {
	if b.tmp == "" {
		return
	}
	if b.o.Keep {
		b.logf("kept %s", b.tmp)
		return
	}
	os.RemoveAll(b.tmp)
}

// describe records the commit and the uncommitted changes of the code the
// controller is built from (read-only git commands; git may be absent).
func (b *bench) describe() buildInfo {
	bi := buildInfo{Date: time.Now().UTC().Format(time.RFC3339), Command: "go run ./hack/scale " + strings.Join(os.Args[1:], " ")}
	if out, err := exec.Command("go", "env", "GOVERSION").Output(); err == nil {
		bi.GoVersion = strings.TrimSpace(string(out))
	}
	git := func(args ...string) string {
		out, _ := b.git(args...)
		return out
	}
	bi.Commit = git("rev-parse", "HEAD")
	for _, l := range strings.Split(git("status", "--porcelain", "--", "cmd", "internal", "compiler", "schema", "go.mod", "go.sum"), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			bi.DirtyFiles = append(bi.DirtyFiles, l)
		}
	}
	return bi
}

func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	if commit == "" {
		return "unknown"
	}
	return commit
}

func dirtyNote(files []string) string {
	if len(files) == 0 {
		return ""
	}
	return fmt.Sprintf(", %d uncommitted changes under cmd/ internal/ compiler/ schema/", len(files))
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "%s scale: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// runAll runs every shape of the matrix, each on a fresh control plane.
func (b *bench) runAll(ctx context.Context) []*result {
	var out []*result
	for i, s := range b.o.shapes {
		if ctx.Err() != nil {
			break
		}
		b.logf("=== run %d/%d: %d routes, %d ConfigMaps, %d pods, %d nodes", i+1, len(b.o.shapes), s.Routes, s.ConfigMaps, b.o.Pods, b.o.Nodes)
		dir := filepath.Join(b.tmp, fmt.Sprintf("run-%d-%s", i+1, s))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			out = append(out, &result{Shape: s, Error: err.Error()})
			continue
		}
		r := b.runOne(ctx, s, dir)
		if r.Error != "" {
			b.logf("run %s FAILED after %.1fs: %s", s, r.WallSeconds, r.Error)
		} else {
			b.logf("run %s done in %.1fs", s, r.WallSeconds)
		}
		out = append(out, r)
	}
	return out
}
