package main

import (
	"context"
	"errors"
	"fmt"
	"path"
	"runtime"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/internal/controller"
	"github.com/modelsphere/autoconfig/internal/kubeclient"
	"github.com/modelsphere/autoconfig/internal/memlimit"
	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

func controllerCommand() *cli.Command {
	o := &controllerOptions{}
	return &cli.Command{
		Use:   "controller [flags]",
		Short: "run the in-cluster ModelRoute reconciler (leader-elected)",
		Long: `
Runs the ModelRoute reconciler: discovers each route's endpoints
(EndpointSlices of a Service, or pods by label), compiles them with the
validated spec and writes the outputs into the consumers' existing
ConfigMaps (one key per route; ConfigMaps are never created). Status and
events on each ModelRoute say what happened. See docs/controller.md.

A replica that cannot reach the API server at start waits for it (a
discovery request every 0.5 s, doubling up to 10 s, each failure logged)
instead of exiting; /healthz answers meanwhile and /readyz is not ready
until the controller is set up and its caches have synced. With
--leader-elect, one replica reconciles; the others are warm standbys.

Exit status: 0 after a clean shutdown (SIGTERM, also while waiting for the
API server), 1 on failure (including a leader that lost its Lease), 2 usage
error.
`,
		Options: o,
		Log:     true,
		Run: func(ctx context.Context, c *cli.Call) error {
			// controller-runtime and the reconciler log through logr; V(n)
			// is slog level -n, so --log-level=debug shows V(1) and V(2).
			log := logr.FromSlogHandler(c.Log.Handler())
			ctrl.SetLogger(log)
			return runManager(ctx, o, log)
		},
	}
}

// LeaderElectionID is the Lease every controller replica competes for.
const LeaderElectionID = "autoconfig.routing.modelsphere.dev"

// controllerOptions are the flags of `autoconfig controller`.
type controllerOptions struct {
	kubeconfig              string
	metricsAddr             string
	probeAddr               string
	pprofAddr               string
	leaderElect             bool
	leaderElectionNamespace string
	leaseDuration           time.Duration
	renewDeadline           time.Duration
	retryPeriod             time.Duration
	namespaces              []string
	trusted                 []string
	sockDir                 string
	maxConcurrent           int
	qps                     float32
	burst                   int
	memoryLimitRatio        float64
	memoryLiveRatio         float64
	gcPercent               int
}

// DefaultMaxConcurrentReconciles: a reconcile spends most of its time
// waiting — for its ConfigMap's batch window and patch, for its status
// patch — and a ConfigMap's batch can only hold the routes in flight. With
// 16, a rollout of 1000 routes in 10 ConfigMaps still made 84 patches of
// each 300 KB ConfigMap and converged 58 s after the last EndpointSlice
// write; with 128, 15 patches and 4.5 s (make bench-scale). A reconcile in
// flight is a goroutine; the CPU work (about 7 ms per route) is the same.
const DefaultMaxConcurrentReconciles = 128

// DefaultKubeAPIQPS and DefaultKubeAPIBurst are the controller's client
// rate limits, the same in-cluster and with --kubeconfig (client-go's own
// default, 5 QPS, applied silently to a --kubeconfig run and made a
// 100-route initial sync take 41 s instead of 6 s). A cold start writes
// per route a finalizer patch, a status patch and an event, plus the
// ConfigMap patches and reads: about 3,200-3,600 requests for 1000 routes
// in 10 ConfigMaps. Measured (hack/scale, 1000x10, 2000 pods, shared
// 2-core machine, docs/performance-history.md): initial sync 39.8 s at 50/100,
// 28.0 and 32.0 s at 200/400, 20.0 s at 500/1000, 18.6 and 15.8 s with no
// client-side limit: below 500 QPS the client, not the server, paces it.
// The API server's Priority and Fairness is what protects the server (it
// queues, then answers 429, which client-go retries). The limit stays
// finite as a ceiling on a runaway loop where APF does not apply (a
// FlowSchema that maps the controller to an exempt priority level); a
// negative --kube-api-qps removes it and leaves the pacing to the server.
const (
	DefaultKubeAPIQPS   = 500
	DefaultKubeAPIBurst = 1000
)

// The leader-election timings: controller-runtime's (and kube-controller-
// manager's) defaults, kept because nothing measured here asks for others.
//
//   - DefaultLeaseDuration (15 s) is how long a standby waits for a Lease
//     that was not renewed before it takes over: the failover time when a
//     leader dies without releasing it (a crash, a lost node). A rollout or
//     SIGTERM releases the Lease at once, so this is the unclean case only.
//     Shorter fails over sooner but lets a slow API server or a GC pause
//     depose a healthy leader.
//   - DefaultRenewDeadline (10 s) is how long a leader keeps trying to
//     renew before it gives up leading (and exits 1 to restart): it rides
//     out an API server blip that long. It must be below the lease
//     duration; the 5 s between them is the margin in which the old leader
//     has stopped writing before a standby may start.
//   - DefaultRetryPeriod (2 s) is how often the leader renews and a standby
//     tries to acquire: one Lease request per replica every 2 s. client-go
//     adds up to 20 % jitter, so it must stay below renew-deadline / 1.2.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

func (o *controllerOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the in-cluster service account)")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus /metrics endpoint; \"0\" disables it")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz; \"0\" disables them")
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", "0", "address of Go's /debug/pprof profiles (heap, CPU, goroutines), e.g. 127.0.0.1:6060; \"0\" disables them. Not authenticated: bind it to localhost")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "elect one active replica through the Lease "+LeaderElectionID+" (required with more than one replica)")
	fs.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader-election Lease (default: the pod's namespace; required outside a cluster)")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", DefaultLeaseDuration, "how long a standby waits for an unrenewed Lease before it takes over: the failover time when a leader dies without releasing it (SIGTERM releases it at once). Shorter fails over sooner but lets a slow API server depose a healthy leader")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", DefaultRenewDeadline, "how long the leader keeps retrying to renew its Lease before it stops leading and exits 1: the API server outage a leader rides out. Must be below --leader-elect-lease-duration, so the old leader has stopped before a standby takes over")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", DefaultRetryPeriod, "how often the leader renews and a standby tries to acquire the Lease (one request per replica each time). client-go adds up to 20 % jitter: must be below --leader-elect-renew-deadline / 1.2")
	fs.Var(cli.StringList{Values: &o.namespaces}, "namespace", "watch only this namespace (repeatable, or comma-separated); default: all namespaces. Must include every namespace routes reference (services, output ConfigMaps)")
	fs.Var(cli.StringList{Values: &o.namespaces}, "watch-namespaces", "same as --namespace (comma-separated), as the Helm chart passes it")
	fs.Var(cli.StringList{Values: &o.trusted}, "trusted-namespace", "a route namespace whose routes may use Services and ConfigMaps in every namespace without a grant on them (repeatable, or comma-separated): the platform team's central route namespace; routes elsewhere need the referenced object's "+sink.AllowedNamespacesAnnotation+" annotation")
	fs.StringVar(&o.sockDir, "sock-dir", compiler.DefaultSockDir, "absolute directory of the per-route unix sockets in the openresty image")
	fs.IntVar(&o.maxConcurrent, "max-concurrent-reconciles", DefaultMaxConcurrentReconciles, "routes reconciled in parallel")
	fs.Float32Var(&o.qps, "kube-api-qps", DefaultKubeAPIQPS, "client-side limit of requests per second to the API server (in-cluster and with --kubeconfig alike); negative: no client-side limit, the API server's Priority and Fairness alone paces the controller. At the default, a cold start of 1000 routes (about 3,500 requests) took 20 s, against 40 s at 50 QPS and 16-19 s with no limit; it still caps a runaway loop")
	fs.IntVar(&o.burst, "kube-api-burst", DefaultKubeAPIBurst, "client-side burst above --kube-api-qps (ignored when it is negative)")
	fs.IntVar(&o.gcPercent, "gc-percent", memlimit.DefaultGCPercent, "the Go garbage collector's target heap growth over live data, in percent (GOGC): lower uses less memory and more CPU; 0 keeps Go's default of 100; an explicit GOGC wins")
	fs.Float64Var(&o.memoryLimitRatio, "memory-limit-ratio", memlimit.DefaultRatio, "set the Go soft memory limit (GOMEMLIMIT) to this share of the container's memory limit, read from its cgroup; 0 disables; an explicit GOMEMLIMIT wins")
	fs.Float64Var(&o.memoryLiveRatio, "memory-live-ratio", memlimit.DefaultLiveRatio, "keep the Go runtime's memory within this multiple of its live data (live heap and goroutine stacks; the largest seen, and at least 48 MiB) with a soft memory limit that follows it, so that what a burst of work needed returns to the OS; 0 disables; never above the limit --memory-limit-ratio sets; an explicit GOMEMLIMIT wins")
}

func (o *controllerOptions) Validate() error {
	var errs []error
	if !path.IsAbs(o.sockDir) {
		errs = append(errs, fmt.Errorf("--sock-dir must be an absolute path, not %q", o.sockDir))
	}
	switch {
	case o.qps == 0:
		errs = append(errs, errors.New("--kube-api-qps must not be 0 (client-go would read it as its default of 5): positive for a limit, negative for none"))
	case o.qps > 0 && o.burst < 1:
		errs = append(errs, fmt.Errorf("--kube-api-burst must be at least 1 with a positive --kube-api-qps, not %d", o.burst))
	}
	switch {
	case o.leaseDuration <= 0 || o.renewDeadline <= 0 || o.retryPeriod <= 0:
		errs = append(errs, fmt.Errorf("--leader-elect-lease-duration, --leader-elect-renew-deadline and --leader-elect-retry-period must be positive, not %v, %v and %v", o.leaseDuration, o.renewDeadline, o.retryPeriod))
	case o.renewDeadline >= o.leaseDuration:
		errs = append(errs, fmt.Errorf("--leader-elect-renew-deadline (%v) must be less than --leader-elect-lease-duration (%v): a leader that cannot renew must stop before a standby takes over", o.renewDeadline, o.leaseDuration))
	case o.renewDeadline <= time.Duration(leaderelection.JitterFactor*float64(o.retryPeriod)):
		errs = append(errs, fmt.Errorf("--leader-elect-retry-period (%v) must be less than --leader-elect-renew-deadline (%v) / %v: the leader needs more than one jittered retry to renew", o.retryPeriod, o.renewDeadline, leaderelection.JitterFactor))
	}
	if o.memoryLiveRatio != 0 && (o.memoryLiveRatio < 1.25 || o.memoryLiveRatio > 10) {
		errs = append(errs, fmt.Errorf("--memory-live-ratio must be 0 (off) or between 1.25 and 10, not %v: below 1.25 the garbage collector would run almost without pause", o.memoryLiveRatio))
	}
	if o.memoryLimitRatio < 0 || o.memoryLimitRatio > 1 {
		errs = append(errs, fmt.Errorf("--memory-limit-ratio must be between 0 and 1, not %v", o.memoryLimitRatio))
	}
	if o.maxConcurrent < 1 {
		errs = append(errs, fmt.Errorf("--max-concurrent-reconciles must be at least 1, not %d", o.maxConcurrent))
	}
	for _, ns := range o.namespaces {
		if strings.ContainsAny(ns, "/ ") {
			errs = append(errs, fmt.Errorf("--namespace %q is not a namespace name", ns))
		}
	}
	return errors.Join(errs...)
}

// restConfig is the API server config (internal/kubeclient) with the
// flags' rate limits, which replace client-go's default (5 QPS) in-cluster
// and with a kubeconfig alike; a negative QPS makes client-go build no
// rate limiter.
func (o *controllerOptions) restConfig() (*rest.Config, error) {
	cfg, err := kubeclient.Config(o.kubeconfig, "")
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = o.qps, o.burst
	return cfg, nil
}

// managerConfig is cfg for the manager's clients: at most
// DefaultMaxInFlight of their requests in flight at once, shared by every
// client the manager builds from it (watches aside).
func managerConfig(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Wrap(limitInFlight(DefaultMaxInFlight))
	return c
}

func runManager(ctx context.Context, o *controllerOptions, log logr.Logger) error {
	cfg, err := o.restConfig()
	if err != nil {
		return err
	}
	if o.pprofAddr == "0" || o.pprofAddr == "" {
		// No one can read a heap profile: stop sampling allocations for
		// one. Each sampled call stack is a bucket that stays in memory
		// for the life of the process (with the 1000-route start-up's
		// variety of stacks, about a MiB and a half).
		runtime.MemProfileRate = 0
	}
	gogc := memlimit.SetGCPercent(o.gcPercent)
	soft, why, err := memlimit.Set("/sys/fs/cgroup", o.memoryLimitRatio)
	if err != nil {
		log.Error(err, "cannot read the container memory limit; no soft memory limit set from it")
	}
	follow := memlimit.Follower{Ratio: o.memoryLiveRatio, Floor: memlimit.DefaultLiveFloor, Cap: soft}
	following := follow.Follow(ctx)
	log.Info("memory limit", "goMemLimit", soft, "reason", why, "gcPercent", gogc, "followsLiveData", following, "liveRatio", o.memoryLiveRatio)
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	v, err := schema.Default()
	if err != nil {
		return err
	}
	// The probes and profiles are served from the start, by us and not the
	// manager: /healthz while the replica waits for the API server, and a
	// manager that binds nothing can be replaced when its setup fails.
	ready := newSetupState("waiting for the API server")
	stopProbes, err := serve(probeServer(o.probeAddr, ready), "health probes", log)
	if err != nil {
		return err
	}
	defer stopProbes()
	stopPprof, err := serve(pprofServer(o.pprofAddr), "pprof", log)
	if err != nil {
		return err
	}
	defer stopPprof()
	log.Info("starting", "version", cli.Version, "kubeAPIQPS", o.qps, "kubeAPIBurst", o.burst, "namespaces", strings.Join(o.namespaces, ","), "trustedNamespaces", strings.Join(o.trusted, ","),
		"leaderElect", o.leaderElect, "leaseDuration", o.leaseDuration.String(), "renewDeadline", o.renewDeadline.String(), "retryPeriod", o.retryPeriod.String())
	var mgr ctrl.Manager
	for {
		// A replica that cannot reach the API server waits for it instead
		// of exiting (which a cluster answers with CrashLoopBackOff, up to
		// 5 minutes away from an API server that is back); SIGTERM ends
		// the wait with exit 0.
		ready.set("waiting for the API server")
		if err := waitForAPIServer(ctx, cfg, log); err != nil {
			if ctx.Err() != nil {
				log.Info("shutdown while waiting for the API server")
				return nil
			}
			return err
		}
		ready.set("setting up")
		// Its informers resume their watches by themselves and tell when
		// they are current after a cut (internal/informer/currency.go).
		caches := controller.NewCacheCurrency()
		mgr, err = newManager(ctx, cfg, scheme, o, log, caches)
		if err != nil {
			return err
		}
		err = setupController(ctx, mgr, o, v, ready, caches)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			log.Info("shutdown while setting up")
			return nil
		}
		// Setting up reads API discovery; when the API server went away
		// again meanwhile, wait for it and set up a new manager.
		if apiErr := apiServerReachable(context.Background(), cfg); apiErr == nil {
			return fmt.Errorf("set up controller: %w", err)
		}
		log.Info("API server lost while setting up the controller; waiting for it again", "error", err.Error())
	}
	ready.set("waiting for the caches to sync")
	return mgr.Start(ctx)
}

// newManager is the controller-runtime manager. It binds no listener (the
// probes and pprof are ours; /metrics binds in Start), so a new one can
// replace it. Its clients keep at most DefaultMaxInFlight requests in
// flight (managerConfig); the leader election's do not.
func newManager(ctx context.Context, cfg *rest.Config, scheme *k8sruntime.Scheme, o *controllerOptions, log logr.Logger, caches *controller.CacheCurrency) (ctrl.Manager, error) {
	lease, renew, retry := o.leaseDuration, o.renewDeadline, o.retryPeriod
	mgr, err := ctrl.NewManager(managerConfig(cfg), ctrl.Options{
		Scheme: scheme,
		// The Lease is renewed outside the bound of requests in flight: a
		// renewal must not queue behind a cold start's writes.
		LeaderElectionConfig: cfg,
		// Stopping the leader elector on SIGTERM is not an error.
		Logger:                        logr.New(shutdownSink{LogSink: log.GetSink(), stopping: func() bool { return ctx.Err() != nil }}),
		Metrics:                       metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress:        "0",
		PprofBindAddress:              "0",
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              LeaderElectionID,
		LeaderElectionNamespace:       o.leaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true, // the standby takes over at once on a rollout
		LeaseDuration:                 &lease,
		RenewDeadline:                 &renew,
		RetryPeriod:                   &retry,
		Cache:                         caches.CacheOptions(controller.CacheOptions(o.namespaces)),
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	return mgr, nil
}

// setupController adds the reconciler, its indexes and watches, and the
// runnable that marks the replica ready, to mgr.
func setupController(ctx context.Context, mgr ctrl.Manager, o *controllerOptions, v *schema.Validator, ready *setupState, caches *controller.CacheCurrency) error {
	r := &controller.Reconciler{
		Validator:         v,
		Recorder:          mgr.GetEventRecorder(controller.Name),
		CompileOptions:    compiler.Options{SockDir: o.sockDir},
		Namespaces:        o.namespaces,
		TrustedNamespaces: o.trusted,
		Routes:            controller.NewRouteState(),
		Caches:            caches,
	}
	if err := r.SetupWithManager(ctx, mgr, o.maxConcurrent); err != nil {
		return err
	}
	return mgr.Add(readyRunnable{ready})
}
