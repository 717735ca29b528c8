// The hagate binary: its command for internal/cli, Run wiring the client,
// the gate and the metrics and health servers.

package hagate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/internal/kubeclient"
	"github.com/modelsphere/autoconfig/internal/readiness"
)

const help = `
hagate keeps one replica of a stateful router active. Every replica joins
leader election on the Lease <name>-ha; only the leader, while its app port
accepts connections and its required listeners are present, labels its own
pod <name>-active=true. Select that label in the consumer Service.

On SIGTERM the Lease is released at once (a standby takes over) and the
label is kept so the terminating pod drains in-flight streams.

Every flag can also be set by the environment variable named after it.
Exit status: 0 after a clean shutdown, 1 on a runtime error, 2 on a usage
error.
`

// Command is the hagate binary; run is Run outside tests.
func Command(run func(context.Context, *Options, *slog.Logger) error) *cli.Command {
	return cli.Sidecar("hagate [flags]", help, EnvName, run)
}

// Run is the sidecar: validated options in, blocking until ctx is done
// (then the Lease is released and nil returned) or start-up fails.
func Run(ctx context.Context, o *Options, logger *slog.Logger) error {
	// client-go's leader election logs through klog; send it to the same
	// handler so one pod has one log format.
	klog.SetSlogLogger(logger)
	cfg, err := kubeclient.Config(o.Kubeconfig, "")
	if err != nil {
		return fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.UserAgent = "hagate"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	reg, metrics := NewRegistry()

	var listeners ListenerGate
	if len(o.RequiredListeners) > 0 {
		d, err := readiness.NewDetector(readiness.Options{
			ProcRoot: o.ProcRoot,
			Ports:    o.RequiredListeners,
			Logger:   logger,
		})
		if err != nil {
			return fmt.Errorf("readiness detector: %w", err)
		}
		listeners = DetectorGate{D: d}
	}
	probeTimeout := min(time.Second, o.Interval)
	gate, err := New(Config{
		Client:        client,
		Namespace:     o.Namespace,
		PodName:       o.PodName,
		LeaseName:     o.LeaseName(),
		LabelKey:      o.LabelKey(),
		LeaseDuration: o.LeaseDuration,
		RenewDeadline: o.RenewDeadline,
		RetryPeriod:   o.RetryPeriod,
		Interval:      o.Interval,
		App:           TCPProbe{Addr: net.JoinHostPort(o.AppHost, strconv.Itoa(o.AppPort)), Timeout: probeTimeout},
		Listeners:     listeners,
		Logger:        logger,
		Metrics:       metrics,
	})
	if err != nil {
		return err
	}

	servers, err := startServers(o, reg, gate, logger)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		for _, s := range servers {
			_ = s.Shutdown(sctx)
		}
	}()

	logger.Info("starting", "lease", o.LeaseName(), "label", o.LabelKey()+"=true", "pod", o.PodName,
		"namespace", o.Namespace, "app", net.JoinHostPort(o.AppHost, strconv.Itoa(o.AppPort)),
		"requiredListeners", o.RequiredListeners)
	return gate.Run(ctx)
}

// startServers binds the metrics and health addresses before the gate
// starts, so a port clash is a start-up error rather than a silent gap.
func startServers(o *Options, reg *prometheus.Registry, gate *Gate, logger *slog.Logger) ([]*http.Server, error) {
	started := time.Now()
	// The loop is wedged if no pass finished for this long: one pass makes
	// at most a few API calls each bounded by RenewDeadline, plus a stop of
	// the elector (also bounded by RenewDeadline).
	stale := 4*o.RenewDeadline + 3*o.Interval
	healthz := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		last := gate.LastTick()
		if last.IsZero() {
			last = started
		}
		if age := time.Since(last); age > stale {
			http.Error(w, fmt.Sprintf("label loop stalled for %v\n", age.Round(time.Millisecond)), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	type srv struct {
		addr string
		mux  *http.ServeMux
	}
	var want []srv
	if o.MetricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		mux.Handle("/healthz", healthz)
		want = append(want, srv{o.MetricsAddr, mux})
	}
	if o.HealthAddr != "" && o.HealthAddr != o.MetricsAddr {
		mux := http.NewServeMux()
		mux.Handle("/healthz", healthz)
		want = append(want, srv{o.HealthAddr, mux})
	}
	var out []*http.Server
	for _, s := range want {
		ln, err := net.Listen("tcp", s.addr)
		if err != nil {
			for _, h := range out {
				h.Close()
			}
			return nil, fmt.Errorf("listen %s: %w", s.addr, err)
		}
		h := &http.Server{Handler: s.mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := h.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error("http server failed", "addr", s.addr, "error", err)
			}
		}()
		logger.Info("serving", "addr", ln.Addr().String())
		out = append(out, h)
	}
	return out, nil
}
