package hagate

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/internal/readiness"
	"github.com/spf13/pflag"
)

// Defaults match client-go's core components (15 s / 10 s / 2 s), which is
// what a cluster operator expects a Lease to behave like.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
	DefaultInterval      = 2 * time.Second
	DefaultMetricsAddr   = ":9402"
	DefaultHealthAddr    = ":9403"
	DefaultAppHost       = "127.0.0.1"
	DefaultProcRoot      = "/proc"
)

// Options are the hagate settings (the log flags are the shared ones of
// internal/cli). Every flag can also come from an
// environment variable (see EnvName); a flag on the command line wins.
type Options struct {
	Name              string
	Namespace         string
	PodName           string
	AppHost           string
	AppPort           int
	RequiredListeners []int
	ProcRoot          string

	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	Interval      time.Duration

	Kubeconfig  string
	MetricsAddr string
	HealthAddr  string
}

// envNames maps flag names to environment variables. Most are PS_ plus the
// flag in upper snake case; --app-port is the exception because
// PS_APP_PORT is exactly what a Service named "ps-app" would inject into
// every pod of the namespace (Kubernetes service links set
// <SVC>_PORT=tcp://…), which would silently override the setting.
var envNames = map[string]string{
	"app-port":                    "PS_APP_PORT_NUMBER",
	"readiness-required-listener": "PS_READINESS_REQUIRED_LISTENERS",
}

// EnvName is the environment variable that sets the flag called name.
func EnvName(name string) string { return cli.EnvName(name, envNames) }

// AddFlags registers every option on fs with its default.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Name, "name", "", "router name: the Lease is <name>-ha and the active pod carries the label <name>-active=true (required)")
	fs.StringVar(&o.Namespace, "namespace", "", "namespace of this pod and of the Lease, from the downward API metadata.namespace (required)")
	fs.StringVar(&o.PodName, "pod-name", "", "name of this pod, from the downward API metadata.name; also the leader-election identity (required)")
	fs.StringVar(&o.AppHost, "app-host", DefaultAppHost, "host of the local app port")
	fs.IntVar(&o.AppPort, "app-port", 0, "local TCP port of the router that must accept connections for this pod to be active (required)")
	fs.Var(cli.PortList{Ports: &o.RequiredListeners}, "readiness-required-listener", "TCP `port` that must have a LISTEN socket in the pod's network namespace (e.g. 15008 for Istio ambient); repeatable; the env form is comma-separated")
	fs.StringVar(&o.ProcRoot, "proc-root", DefaultProcRoot, "procfs mount read for --readiness-required-listener")
	fs.DurationVar(&o.LeaseDuration, "lease-duration", DefaultLeaseDuration, "how long a standby waits after the leader's last renewal before taking over after a crash (whole seconds)")
	fs.DurationVar(&o.RenewDeadline, "renew-deadline", DefaultRenewDeadline, "how long the leader retries renewing before it steps down and drops its label (< --lease-duration)")
	fs.DurationVar(&o.RetryPeriod, "retry-period", DefaultRetryPeriod, "how often candidates try to acquire or renew the Lease")
	fs.DurationVar(&o.Interval, "interval", DefaultInterval, "how often the pod's label is compared with the desired state and fixed")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the in-cluster service account)")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", DefaultMetricsAddr, "address serving /metrics (and /healthz); empty disables")
	fs.StringVar(&o.HealthAddr, "health-addr", DefaultHealthAddr, "address serving /healthz; empty or equal to --metrics-addr serves it only there")
}

// ApplyEnv sets every flag not given on the command line from its
// environment variable. Call it after fs.Parse; explicit flags win.
func ApplyEnv(fs *pflag.FlagSet, lookup func(string) (string, bool)) error {
	return cli.ApplyEnv(fs, lookup, EnvName)
}

// LeaseName is the Lease the replicas elect a leader on.
func (o *Options) LeaseName() string { return o.Name + "-ha" }

// LabelKey is the label the active pod carries with the value "true".
func (o *Options) LabelKey() string { return o.Name + "-active" }

// Validate reports every problem at once; the caller exits 2.
func (o *Options) Validate() error {
	var errs []error
	req := func(v, flagName string) {
		if v == "" {
			errs = append(errs, fmt.Errorf("--%s (or %s) is required", flagName, EnvName(flagName)))
		}
	}
	req(o.Name, "name")
	req(o.Namespace, "namespace")
	req(o.PodName, "pod-name")
	if o.Name != "" {
		for _, m := range validation.IsDNS1123Subdomain(o.LeaseName()) {
			errs = append(errs, fmt.Errorf("--name: Lease name %q: %s", o.LeaseName(), m))
		}
		for _, m := range validation.IsQualifiedName(o.LabelKey()) {
			errs = append(errs, fmt.Errorf("--name: label key %q: %s", o.LabelKey(), m))
		}
	}
	if o.AppPort < 1 || o.AppPort > 65535 {
		errs = append(errs, fmt.Errorf("--app-port (or %s) must be 1-65535, got %d", EnvName("app-port"), o.AppPort))
	}
	if o.AppHost == "" {
		errs = append(errs, errors.New("--app-host must not be empty"))
	}
	if err := readiness.ValidatePorts(o.RequiredListeners); err != nil {
		errs = append(errs, fmt.Errorf("--readiness-required-listener: %w", err))
	}
	if o.RetryPeriod <= 0 || o.RenewDeadline <= 0 || o.LeaseDuration <= 0 || o.Interval <= 0 {
		errs = append(errs, errors.New("--lease-duration, --renew-deadline, --retry-period and --interval must be positive"))
	} else {
		// The Lease stores whole seconds and standbys judge expiry by the
		// stored value, so a fractional duration would let a standby take
		// over before the leader's renew deadline has passed.
		if o.LeaseDuration%time.Second != 0 {
			errs = append(errs, fmt.Errorf("--lease-duration must be whole seconds, got %v", o.LeaseDuration))
		}
		if o.RenewDeadline >= o.LeaseDuration {
			errs = append(errs, fmt.Errorf("--renew-deadline (%v) must be shorter than --lease-duration (%v) so a leader steps down before a standby may take over", o.RenewDeadline, o.LeaseDuration))
		}
		// client-go's own rule: retries are jittered by up to 1.2×.
		if float64(o.RenewDeadline) <= 1.2*float64(o.RetryPeriod) {
			errs = append(errs, fmt.Errorf("--renew-deadline (%v) must be longer than 1.2 × --retry-period (%v)", o.RenewDeadline, o.RetryPeriod))
		}
	}
	return errors.Join(errs...)
}
