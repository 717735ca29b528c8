package reload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync/atomic"
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
// a component fails.
func Run(ctx context.Context, o *Options, log *slog.Logger) error {
	sig, err := ParseSignal(o.Signal)
	if err != nil {
		return err
	}
	var check []string
	if o.CheckCmd != "" {
		if check, err = SplitCommand(o.CheckCmd); err != nil {
			return err
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector("reload"))
	m := NewMetrics(reg)

	dirs := append([]string(nil), o.WatchDirs...)
	var cs kubernetes.Interface
	if o.ConfigMap != "" || o.PodName != "" {
		cfg, err := kubeclient.Config(o.Kubeconfig, kubeclient.InCluster)
		if err != nil {
			return err
		}
		// client-go's default (5 requests/s, bursts of 10) held the served
		// report of a push back by 150 ms once changes came faster than
		// five a second (measured: BenchmarkEndpointChangeToServed at 50
		// changes). The sidecar's requests are one watch and one report
		// patch per loaded change (a newer report replaces one not yet
		// written), so the limit only bounds a burst.
		cfg.QPS, cfg.Burst = 20, 40
		if cs, err = kubernetes.NewForConfig(cfg); err != nil {
			return fmt.Errorf("kubernetes client: %w", err)
		}
	}
	var cmSync *ConfigMapSync
	if o.ConfigMap != "" {
		ns, name, err := SplitNamespacedName(o.ConfigMap)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(o.WriteDir, 0o755); err != nil {
			return fmt.Errorf("--write-dir: %w", err)
		}
		cmSync = &ConfigMapSync{Client: cs, Namespace: ns, Name: name, Resync: o.Resync, Log: log, Synced: make(chan struct{})}
		dirs = append(dirs, o.WriteDir)
	}
	for _, d := range dirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return fmt.Errorf("watch directory %s: not a readable directory: %v", d, err)
		}
	}
	r := &Reloader{
		Dirs: dirs, Process: o.Process, SockDir: o.SockDir, CheckCmd: check, CheckTimeout: o.CheckTimeout,
		Signal: sig, Debounce: o.Debounce, MaxDelay: o.MaxDelay, VerifyTimeout: o.VerifyTimeout, SockSweep: o.SockSweep, ProcRoot: o.ProcRoot,
		Resync: o.Resync, RetryMax: o.RetryMax, Log: log, Metrics: m,
	}
	if cmSync != nil {
		r.Source, r.WriteDir = cmSync, o.WriteDir
	}
	var rep *PodReporter
	if o.PodName != "" {
		rep = &PodReporter{Client: cs, Namespace: o.PodNamespace, Name: o.PodName, RetryMax: o.RetryMax, Log: log, Metrics: m}
		r.Report = rep.Report
	}

	var watching atomic.Bool
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
			ready := watching.Load()
			if cmSync != nil {
				select {
				case <-cmSync.Synced:
				default:
					ready = false
				}
			}
			if !ready {
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
	ready := make(chan struct{})
	g.Go(func() error {
		// The watcher is started before the API sync writes anything, so
		// the first write is seen as a change.
		r.Started = ready
		err := r.Run(ctx)
		if err == nil && ctx.Err() == nil {
			err = errors.New("watcher stopped")
		}
		return err
	})
	if rep != nil {
		g.Go(func() error { return rep.Run(ctx) })
	}
	if cmSync != nil {
		g.Go(func() error {
			select {
			case <-ready:
			case <-ctx.Done():
				return nil
			}
			return cmSync.Run(ctx)
		})
	}
	g.Go(func() error {
		select {
		case <-ready:
			watching.Store(true)
		case <-ctx.Done():
		}
		return nil
	})
	return g.Wait()
}
