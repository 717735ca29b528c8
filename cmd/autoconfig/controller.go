package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path"
	"strings"

	"github.com/go-logr/logr"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/controller"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

func init() {
	commands["controller"] = command{summary: "run the in-cluster ModelRoute reconciler (leader-elected)", run: runController}
}

// LeaderElectionID is the Lease every controller replica competes for.
const LeaderElectionID = "autoconfig.routing.modelsphere.dev"

// controllerOptions are the flags of `autoconfig controller`.
type controllerOptions struct {
	kubeconfig              string
	metricsAddr             string
	probeAddr               string
	leaderElect             bool
	leaderElectionNamespace string
	namespaces              stringList
	sockDir                 string
	maxConcurrent           int
	logLevel                string
	logFormat               string
}

// stringList is a repeatable flag that also splits on commas.
type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }

func (s *stringList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*s = append(*s, p)
		}
	}
	return nil
}

func (o *controllerOptions) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the in-cluster service account)")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus /metrics endpoint; \"0\" disables it")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz; \"0\" disables them")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "elect one active replica through the Lease "+LeaderElectionID+" (required with more than one replica)")
	fs.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader-election Lease (default: the pod's namespace; required outside a cluster)")
	fs.Var(&o.namespaces, "namespace", "watch only this namespace (repeatable, or comma-separated); default: all namespaces. Must include every namespace routes reference (services, output ConfigMaps)")
	fs.Var(&o.namespaces, "watch-namespaces", "same as --namespace (comma-separated), as the Helm chart passes it")
	fs.StringVar(&o.sockDir, "sock-dir", compiler.DefaultSockDir, "absolute directory of the per-route unix sockets in the openresty image")
	fs.IntVar(&o.maxConcurrent, "max-concurrent-reconciles", 4, "routes reconciled in parallel")
	fs.StringVar(&o.logLevel, "log-level", "info", "log verbosity: error, info, debug or trace")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
}

func (o *controllerOptions) Validate() error {
	var errs []error
	if !path.IsAbs(o.sockDir) {
		errs = append(errs, fmt.Errorf("--sock-dir must be an absolute path, not %q", o.sockDir))
	}
	if o.maxConcurrent < 1 {
		errs = append(errs, fmt.Errorf("--max-concurrent-reconciles must be at least 1, not %d", o.maxConcurrent))
	}
	if _, err := o.level(); err != nil {
		errs = append(errs, err)
	}
	if o.logFormat != "text" && o.logFormat != "json" {
		errs = append(errs, fmt.Errorf("--log-format must be text or json, not %q", o.logFormat))
	}
	for _, ns := range o.namespaces {
		if strings.ContainsAny(ns, "/ ") {
			errs = append(errs, fmt.Errorf("--namespace %q is not a namespace name", ns))
		}
	}
	return errors.Join(errs...)
}

// level maps --log-level to an slog level; logr's V(n) is slog level -n,
// so debug = V(1) and trace = V(2) (the controller's named levels).
func (o *controllerOptions) level() (slog.Level, error) {
	switch o.logLevel {
	case "error":
		return slog.LevelError, nil
	case "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.Level(-1), nil
	case "trace":
		return slog.Level(-2), nil
	}
	return 0, fmt.Errorf("--log-level must be error, info, debug or trace, not %q", o.logLevel)
}

func (o *controllerOptions) logger(w io.Writer) logr.Logger {
	lvl, _ := o.level()
	ho := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler = slog.NewTextHandler(w, ho)
	if o.logFormat == "json" {
		h = slog.NewJSONHandler(w, ho)
	}
	return logr.FromSlogHandler(h)
}

func (o *controllerOptions) restConfig() (*rest.Config, error) {
	if o.kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	}
	return ctrlconfig.GetConfig()
}

func runController(ctx context.Context, args []string, _ io.Reader, _, stderr io.Writer) int {
	var o controllerOptions
	fs, code, ok := parseFlags("controller", args, stderr, joinLines(
		"Usage: autoconfig controller [flags]",
		"",
		"Runs the ModelRoute reconciler: discovers each route's endpoints",
		"(EndpointSlices of a Service, or pods by label), compiles them with the",
		"validated spec and writes the outputs into the consumers' existing",
		"ConfigMaps (one key per route; ConfigMaps are never created). Status and",
		"events on each ModelRoute say what happened. See docs/controller.md.",
		"",
		"Exit status: 0 after a clean shutdown (SIGTERM), 1 on failure, 2 usage error.",
		"",
		"Flags:"), o.AddFlags)
	if !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "autoconfig controller: unexpected arguments %q\n", fs.Args())
		fs.Usage()
		return 2
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintf(stderr, "autoconfig controller: %v\n", err)
		return 2
	}
	log := o.logger(stderr)
	ctrl.SetLogger(log)
	if err := runManager(ctx, &o, log); err != nil {
		log.Error(err, "controller stopped")
		return 1
	}
	return 0
}

func runManager(ctx context.Context, o *controllerOptions, log logr.Logger) error {
	cfg, err := o.restConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress:        o.probeAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              LeaderElectionID,
		LeaderElectionNamespace:       o.leaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true, // the standby takes over at once on a rollout
		Cache:                         controller.CacheOptions(o.namespaces),
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	v, err := schema.Default()
	if err != nil {
		return err
	}
	r := &controller.Reconciler{
		Validator:      v,
		Recorder:       mgr.GetEventRecorder(controller.Name),
		CompileOptions: compiler.Options{SockDir: o.sockDir},
	}
	if err := r.SetupWithManager(ctx, mgr, o.maxConcurrent); err != nil {
		return fmt.Errorf("set up controller: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	log.Info("starting", "version", Version, "namespaces", o.namespaces.String(), "leaderElect", o.leaderElect)
	return mgr.Start(ctx)
}
