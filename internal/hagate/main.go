package hagate

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/modelsphere/autoconfig/internal/readiness"
	"github.com/modelsphere/autoconfig/internal/sidecar"
)

const usageHead = `Usage: hagate [flags]

hagate keeps one replica of a stateful router active. Every replica joins
leader election on the Lease <name>-ha; only the leader, while its app port
accepts connections and its required listeners are present, labels its own
pod <name>-active=true. Select that label in the consumer Service.

On SIGTERM the Lease is released at once (a standby takes over) and the
label is kept so the terminating pod drains in-flight streams.

Every flag can also be set by the environment variable named after it.
Exit status: 0 after a clean shutdown, 1 on a runtime error, 2 on a usage
error.

Flags:
`

// Main runs hagate with args (without the program name) and returns the
// exit status. lookupEnv is os.LookupEnv outside tests.
func Main(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) int {
	// Catch SIGTERM first thing: a pod deleted right after it started must
	// still shut down cleanly (release, keep the label) rather than die.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	var o Options
	fs := flag.NewFlagSet("hagate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.AddFlags(fs)
	fs.Usage = func() { printUsage(fs) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "hagate: unexpected arguments %q\n", fs.Args())
		fs.Usage()
		return 2
	}
	if err := ApplyEnv(fs, lookupEnv); err != nil {
		fmt.Fprintf(stderr, "hagate: %v\n", err)
		return 2
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintf(stderr, "hagate: invalid flags:\n%v\nRun hagate -help for usage.\n", err)
		return 2
	}
	logger := newLogger(&o, stderr)
	// client-go's leader election logs through klog; send it to the same
	// handler so one pod has one log format.
	klog.SetSlogLogger(logger)

	if err := run(ctx, &o, logger); err != nil {
		logger.Error("hagate failed", "error", err)
		return 1
	}
	return 0
}

// printUsage lists flags GNU-style (--name), as the docs and manifests
// spell them (Go's flag package accepts one or two dashes), with the
// environment variable and default of each.
func printUsage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprint(w, usageHead)
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		fmt.Fprintf(w, "%s\n    \t%s\n    \tenv %s", line, usage, EnvName(f.Name))
		if f.DefValue != "" && f.DefValue != "0" {
			fmt.Fprintf(w, ", default %q", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

func newLogger(o *Options, w io.Writer) *slog.Logger {
	return sidecar.NewLogger(o.LogLevel, o.LogFormat, w)
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

func run(ctx context.Context, o *Options, logger *slog.Logger) error {
	cfg, err := restConfig(o.Kubeconfig)
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
