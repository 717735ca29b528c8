package reload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"

	"github.com/modelsphere/autoconfig/internal/buildinfo"
	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/internal/kubeclient"
)

const help = `
reload watches a mounted ConfigMap directory (or one ConfigMap through the
API), and on a settled change validates the configuration, removes stale
unix sockets, sends a signal (HUP) to the consumer's main process and
verifies the reload.

Every flag can also be set by its PS_ environment variable (--check-cmd:
PS_CHECK_CMD); a flag on the command line wins.
Exit status: 0 after a clean shutdown, 1 on a runtime error, 2 on a usage
error.
`

// Command is the reload binary; run is Run outside tests.
func Command(run func(context.Context, *Options, *slog.Logger) error) *cli.Command {
	return cli.Sidecar("reload --watch DIR --process MATCH [flags]", help, EnvName, run)
}

// Run is the sidecar: validated options in, blocking until ctx is done or
// a component fails. It serves /metrics, /healthz and /readyz beside the
// Reloader New builds from o.
func Run(ctx context.Context, o *Options, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector("reload"))
	r, err := New(*o, log, reg)
	if err != nil {
		return err
	}

	g, ctx := errgroup.WithContext(ctx)
	if o.MetricsAddr != "" {
		ln, err := net.Listen("tcp", o.MetricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		log.Info("serving metrics", "addr", ln.Addr().String())
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			if !r.Ready() {
				http.Error(w, "not ready", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		g.Go(func() error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		})
	}
	g.Go(func() error { return r.Run(ctx) })
	return g.Wait()
}

// New checks opts and builds the sidecar from a copy of them, with the
// defaults filled in for zero values (the caller's Options are not
// changed). log may be nil (no logs) and reg nil (metrics kept private).
//
// With ConfigMap or PodName it prepares one API client (internal/
// kubeclient), the ConfigMap's watch and the served report; it creates
// WriteDir and checks that every watched directory is one.
// Nothing is watched, signalled or sent to the API server before Run.
func New(opts Options, log *slog.Logger, reg prometheus.Registerer) (*Reloader, error) {
	o := opts.withDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	sig, err := ParseSignal(o.Signal)
	if err != nil {
		return nil, err
	}
	var check []string
	if o.CheckCmd != "" {
		if check, err = SplitCommand(o.CheckCmd); err != nil {
			return nil, err
		}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	e := &env{dirs: o.WatchDirs, log: log, metrics: NewMetrics(reg), now: time.Now, snapshot: TakeSnapshot}
	r := &Reloader{env: e, opts: o, push: newPusher(e, o.SockDir, o.Resync), started: make(chan struct{})}
	r.sig = &signalTrigger{
		env: e, procRoot: o.ProcRoot, process: o.Process, sockDir: o.SockDir, verifyTimeout: o.VerifyTimeout,
		signal: sig, check: &checker{cmd: check, timeout: o.CheckTimeout}, push: r.push,
		self: os.Getpid(), kill: KillSignaller{},
	}
	r.triggers = []trigger{r.push, r.sig}
	var cs kubernetes.Interface
	if o.ConfigMap != "" || o.PodName != "" {
		cfg, err := kubeclient.Config(o.Kubeconfig, "")
		if err != nil {
			return nil, err
		}
		// client-go's default (5 requests/s, bursts of 10) held the served
		// report of a push back by 150 ms once changes came faster than
		// five a second (measured: BenchmarkEndpointChangeToServed at 50
		// changes). The sidecar's requests are one watch and one report
		// patch per loaded change (a newer report replaces one not yet
		// written), so the limit only bounds a burst.
		cfg.QPS, cfg.Burst = 20, 40
		if cs, err = kubernetes.NewForConfig(cfg); err != nil {
			return nil, fmt.Errorf("kubernetes client: %w", err)
		}
	}
	if o.ConfigMap != "" {
		ns, name, err := SplitNamespacedName(o.ConfigMap)
		if err != nil {
			return nil, err
		}
		if err := os.MkdirAll(o.WriteDir, 0o755); err != nil {
			return nil, fmt.Errorf("--write-dir: %w", err)
		}
		r.cmSync = &ConfigMapSync{Client: cs, Namespace: ns, Name: name, Resync: o.Resync, Log: log, Synced: make(chan struct{})}
		setSource(r, r.cmSync, o.WriteDir)
		r.dirs = append(r.dirs, o.WriteDir)
	}
	for _, d := range r.dirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("watch directory %s: not a readable directory: %v", d, err)
		}
	}
	if o.PodName != "" {
		r.reporter = &PodReporter{Client: cs, Namespace: o.PodNamespace, Name: o.PodName, RetryMax: o.RetryMax, Log: log, Metrics: r.metrics}
		r.report = r.reporter.Report
		if o.SockDir != "" {
			r.demand = &DemandPoller{Path: demandSocket(o.SockDir), Interval: o.DemandInterval, Granularity: o.DemandGranularity, Set: r.reporter.SetDemand, Log: log}
		}
	}
	return r, nil
}

// Run watches until ctx is done (then it returns nil) or a component
// fails: the directories' watch loop and, as New built them, the
// ConfigMap's watch (started once the directories are watched, so its
// first write is seen as a change) and the served report. Run may be
// called once.
func (r *Reloader) Run(ctx context.Context) error {
	if r.ran.Swap(true) {
		return errors.New("reload: Run called twice")
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		err := r.watch(ctx)
		if err == nil && ctx.Err() == nil {
			err = errors.New("watcher stopped")
		}
		return err
	})
	if r.reporter != nil {
		g.Go(func() error { return r.reporter.Run(ctx) })
	}
	if r.demand != nil {
		g.Go(func() error { return r.demand.Run(ctx) })
	}
	if r.cmSync != nil {
		g.Go(func() error {
			select {
			case <-r.started:
			case <-ctx.Done():
				return nil
			}
			return r.cmSync.Run(ctx)
		})
	}
	return g.Wait()
}

// Started is closed once the directories are watched: a change made from
// then on is acted on.
func (r *Reloader) Started() <-chan struct{} { return r.started }

// Ready reports what /readyz says: the directories are watched and, in
// API mode, the ConfigMap's first content is on disk.
func (r *Reloader) Ready() bool {
	select {
	case <-r.started:
	default:
		return false
	}
	if r.cmSync != nil {
		select {
		case <-r.cmSync.Synced:
		default:
			return false
		}
	}
	return true
}
