package reload

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/internal/served"
	"github.com/spf13/pflag"
)

// DefaultDebounce is how long the directories must stay quiet before a
// change is acted on. Kubelet's "..data" swap is a handful of syscalls
// within a millisecond or two and a plain writer's burst (kubectl cp, an
// editor) is done within tens of milliseconds; 250 ms coalesces both into
// one reload while adding little to a propagation that takes 60–90 s via
// kubelet, and keeps API mode well under one second end to end.
const DefaultDebounce = 250 * time.Millisecond

// DefaultMaxDelay bounds how long a seen change may wait for quiet: a
// steady writer (another key of the same ConfigMap rewritten every 140 ms)
// otherwise postpones every reload for as long as it writes. 2 s is eight
// debounces: bursts still coalesce, a flood costs at most one reload every
// 2 s, and no change waits longer than 2 s plus one reload.
const DefaultMaxDelay = 2 * time.Second

// DefaultResync is how often the content is compared with what the target
// last loaded without waiting for an event (prometheus-operator's
// config-reloader does the same): a lost inotify event, a reload refused
// for a transient reason (a check timing out under load), a quarantined key
// that passes now. One fingerprint of at most a ConfigMap's 1 MiB a minute
// costs nothing; a content the check refuses is checked again once a minute.
const DefaultResync = time.Minute

// DefaultRetryMax caps the backoff (0.5 s, doubling) of retries after an
// error that says nothing about the content: no or several target
// processes, unreadable directories, a failed write, a refused signal. 30 s
// keeps a long outage quiet in the logs and still serves the change within
// half a minute of the cause going away.
const DefaultRetryMax = 30 * time.Second

// DefaultVerifyTimeout bounds the wait for new worker pids after a HUP.
// nginx reloads in 14–210 ms for 7–306 routes, but a stale socket makes
// bind() retry for about 2.5 s before the reload is aborted; 5 s covers a
// slow reload without calling it failed, and a failure is reported within 5 s.
const DefaultVerifyTimeout = 5 * time.Second

// DefaultSockSweep is how often, with --sock-dir, the sidecar looks for a
// replaced or vanished target to remove the sockets a crash left behind. A
// restarted nginx retries a failed bind() 5 times 500 ms apart; sweeping
// every second clears the path inside that window, so the restart succeeds
// instead of crash-looping.
const DefaultSockSweep = time.Second

// DefaultCheckTimeout bounds one --check-cmd run ("nginx -t" takes about
// 0.16 s for 306 routes).
const DefaultCheckTimeout = 30 * time.Second

// EnvPrefix prefixes the environment variable of every flag
// (--check-cmd ↔ PS_CHECK_CMD). "PS_" is not a prefix Kubernetes service
// links inject (<SERVICE>_SERVICE_HOST, <SERVICE>_PORT…).
const EnvPrefix = cli.EnvPrefix

// Options configure the sidecar. The flags fill them (AddFlags, ApplyEnv,
// Validate); New takes a copy and fills a zero duration, Signal or
// ProcRoot with its default, so a caller (a test) sets only what it needs.
// Nothing else is in here: the Reloader keeps its state to itself. The log
// flags are the shared ones of internal/cli.
type Options struct {
	// WatchDirs are the directories watched and fingerprinted (kubelet
	// ConfigMap mounts or plain directories).
	WatchDirs []string
	// Process matches the target's argv[0] (MatchArgv0).
	Process string
	// SockDir, if set, is where the per-route unix sockets are: stale ones
	// are removed before signalling, and the engine's control socket there
	// takes peers tables without a reload (push.go).
	SockDir string
	// CheckCmd is run before signalling (SplitCommand splits it).
	CheckCmd string
	// Signal is sent to the target (ParseSignal; default HUP).
	Signal   string
	Debounce time.Duration
	// MaxDelay bounds the wait for quiet: a change is acted on at most
	// this long after it was first seen, however many events follow
	// (default: DefaultMaxDelay, or Debounce if that is longer).
	MaxDelay      time.Duration
	VerifyTimeout time.Duration
	// CheckTimeout bounds one CheckCmd run.
	CheckTimeout time.Duration
	// SockSweep is how often, with SockDir, the target's pid is checked;
	// when it changed or the target is gone, stale sockets are removed
	// without waiting for a configuration change.
	SockSweep time.Duration
	// Resync is how often the content is compared with what the target
	// last loaded even without an event; it also retries a content the
	// check or the target refused.
	Resync time.Duration
	// RetryMax caps the backoff of retries after an error (no process,
	// unreadable directories, a failed write, a refused signal).
	RetryMax time.Duration
	// MetricsAddr is where Run serves /metrics, /healthz and /readyz
	// ("" = nowhere); New does not use it.
	MetricsAddr string
	ProcRoot    string // default /proc

	ConfigMap  string // ns/name, API mode
	WriteDir   string
	Kubeconfig string

	// PodName and PodNamespace name the sidecar's own Pod: the served
	// report goes there (served.go).
	PodName      string
	PodNamespace string

	// DemandInterval is how often, with SockDir and PodName, the engine's
	// demand report (scale to zero) is read into the served report;
	// DemandGranularity is the step of the last request's time there
	// (demand.go).
	DemandInterval    time.Duration
	DemandGranularity time.Duration
}

// withDefaults is a copy of o with every zero duration, Signal and
// ProcRoot set to its default; WatchDirs is copied too.
func (o Options) withDefaults() Options {
	o.WatchDirs = slices.Clone(o.WatchDirs)
	if o.Signal == "" {
		o.Signal = "HUP"
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&o.Debounce, DefaultDebounce},
		{&o.VerifyTimeout, DefaultVerifyTimeout},
		{&o.CheckTimeout, DefaultCheckTimeout},
		{&o.SockSweep, DefaultSockSweep},
		{&o.Resync, DefaultResync},
		{&o.RetryMax, DefaultRetryMax},
		{&o.DemandInterval, DefaultDemandInterval},
		{&o.DemandGranularity, served.DemandGranularity},
	} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if o.MaxDelay == 0 {
		o.MaxDelay = max(DefaultMaxDelay, o.Debounce)
	}
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	return o
}

// AddFlags registers the options on fs with their defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.Var(cli.StringList{Values: &o.WatchDirs}, "watch", "`directory` to watch (repeatable, or comma-separated); a kubelet ConfigMap mount or a plain directory")
	fs.StringVar(&o.Process, "process", "", `the target process, matched against argv[0] only: equal, same basename, or argv[0] starting with it (e.g. "nginx: master", "cache-aware-router")`)
	fs.StringVar(&o.SockDir, "sock-dir", "", "directory of per-route unix sockets; stale ones (connect refused) are removed before signalling")
	fs.StringVar(&o.CheckCmd, "check-cmd", "", `validation command run before signalling (e.g. "nginx -t -q -p /usr/local/openresty/nginx/ -c conf/nginx.conf"); split on spaces, quotes group; a non-zero exit means no signal`)
	fs.StringVar(&o.Signal, "signal", "HUP", "signal to send (HUP, USR1, USR2, …); only HUP is verified by worker pids")
	fs.DurationVar(&o.Debounce, "debounce", DefaultDebounce, "quiet time before a change is acted on (coalesces bursts)")
	fs.DurationVar(&o.MaxDelay, "max-delay", DefaultMaxDelay, "longest a change waits for quiet: under a steady stream of writes a change is still acted on this long after it was first seen (at least --debounce)")
	fs.DurationVar(&o.VerifyTimeout, "verify-timeout", DefaultVerifyTimeout, "how long to wait for new worker pids after a HUP before reporting the reload failed")
	fs.DurationVar(&o.CheckTimeout, "check-timeout", DefaultCheckTimeout, "bound of one --check-cmd run")
	fs.DurationVar(&o.SockSweep, "sock-sweep", DefaultSockSweep, "with --sock-dir: how often to check whether the target was replaced or is gone, and then remove stale sockets")
	fs.DurationVar(&o.Resync, "resync", DefaultResync, "how often the content is compared with what the target last loaded without an event (lost events, a refused content tried again, quarantined keys); also the API-mode informer's resync")
	fs.DurationVar(&o.RetryMax, "retry-max", DefaultRetryMax, "longest wait between retries after an error (no target process, unreadable directory, failed write); retries start at 0.5s and double")
	fs.DurationVar(&o.DemandInterval, "demand-interval", DefaultDemandInterval, "with --sock-dir and --pod-name: how often the engine's demand report (requests held at zero, last request; GET /demand on its control socket) is read into the served report, which the controller reads to wake a scale-to-zero route's workload")
	fs.DurationVar(&o.DemandGranularity, "demand-granularity", served.DemandGranularity, "the step of a route's last-request time in the served report: a busy route changes the Pod's annotation at most once per step, and the controller waits one step more than idleAfter before it scales to 0")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", ":9102", `address of /metrics, /healthz and /readyz ("" disables)`)
	fs.StringVar(&o.ProcRoot, "proc-root", "/proc", "where /proc is mounted")
	fs.StringVar(&o.ConfigMap, "configmap", "", "API mode: namespace/name of a ConfigMap to watch through the API and write into --write-dir (sub-second instead of kubelet's 60–90 s)")
	fs.StringVar(&o.WriteDir, "write-dir", "", "API mode: directory the ConfigMap's keys are written into, in kubelet's ..data layout (also watched)")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "with --configmap or --pod-name: kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the in-cluster service account)")
	fs.StringVar(&o.PodName, "pod-name", "", "the sidecar's own Pod (set PS_POD_NAME from the downward API, metadata.name): after the target loads a content, the ID of each key it loaded is recorded in the Pod's annotation "+served.Annotation+", which the controller reads to tell which pods serve a route's current output; needs get and patch on pods")
	fs.StringVar(&o.PodNamespace, "pod-namespace", "", "namespace of --pod-name (PS_POD_NAMESPACE from the downward API, metadata.namespace)")
}

// EnvName is the environment variable of a flag: PS_ + upper snake case.
func EnvName(flagName string) string { return cli.EnvName(flagName, nil) }

// ApplyEnv sets every flag not given on the command line from its
// environment variable, if present. Call it after fs.Parse.
func ApplyEnv(fs *pflag.FlagSet, lookup func(string) (string, bool)) error {
	return cli.ApplyEnv(fs, lookup, EnvName)
}

// Validate checks the options; its errors are usage errors.
func (o *Options) Validate() error {
	var errs []error
	if o.Process == "" {
		errs = append(errs, errors.New("--process is required (the target's argv[0], e.g. \"nginx: master\")"))
	}
	if len(o.WatchDirs) == 0 && o.ConfigMap == "" {
		errs = append(errs, errors.New("nothing to watch: give --watch DIR or --configmap ns/name with --write-dir DIR"))
	}
	if (o.ConfigMap == "") != (o.WriteDir == "") {
		errs = append(errs, errors.New("--configmap and --write-dir go together"))
	}
	if o.ConfigMap != "" {
		if _, _, err := SplitNamespacedName(o.ConfigMap); err != nil {
			errs = append(errs, err)
		}
	}
	if o.Kubeconfig != "" && o.ConfigMap == "" && o.PodName == "" {
		errs = append(errs, errors.New("--kubeconfig is only used with --configmap or --pod-name"))
	}
	if (o.PodName == "") != (o.PodNamespace == "") {
		errs = append(errs, errors.New("--pod-name and --pod-namespace go together (the downward API's metadata.name and metadata.namespace)"))
	}
	if _, err := ParseSignal(o.Signal); err != nil {
		errs = append(errs, err)
	}
	if o.CheckCmd != "" {
		if _, err := SplitCommand(o.CheckCmd); err != nil {
			errs = append(errs, fmt.Errorf("--check-cmd: %w", err))
		}
	}
	if o.Debounce <= 0 || o.VerifyTimeout <= 0 || o.CheckTimeout <= 0 || o.SockSweep <= 0 || o.Resync <= 0 || o.RetryMax <= 0 || o.DemandInterval <= 0 || o.DemandGranularity <= 0 {
		errs = append(errs, errors.New("--debounce, --verify-timeout, --check-timeout, --sock-sweep, --resync, --retry-max, --demand-interval and --demand-granularity must be positive"))
	}
	if o.MaxDelay < o.Debounce {
		errs = append(errs, fmt.Errorf("--max-delay %s must be at least --debounce %s", o.MaxDelay, o.Debounce))
	}
	return errors.Join(errs...)
}

// SplitNamespacedName splits "ns/name".
func SplitNamespacedName(s string) (ns, name string, err error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("--configmap %q: use namespace/name", s)
	}
	return ns, name, nil
}

var signals = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2,
	"TERM": syscall.SIGTERM, "QUIT": syscall.SIGQUIT, "INT": syscall.SIGINT, "WINCH": syscall.SIGWINCH,
}

// ParseSignal accepts HUP, SIGHUP, hup, … .
func ParseSignal(s string) (syscall.Signal, error) {
	if sig, ok := signals[strings.TrimPrefix(strings.ToUpper(s), "SIG")]; ok {
		return sig, nil
	}
	return 0, fmt.Errorf("--signal %q: use one of HUP, USR1, USR2, TERM, QUIT, INT, WINCH", s)
}

// SplitCommand splits a command line on unquoted whitespace; single and
// double quotes group (no escapes, no expansion: no shell is needed in the
// sidecar image).
func SplitCommand(s string) ([]string, error) {
	var (
		args  []string
		cur   strings.Builder
		quote rune
		inArg bool
	)
	for _, c := range s {
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				cur.WriteRune(c)
			}
		case c == '"' || c == '\'':
			quote, inArg = c, true
		case unicode.IsSpace(c):
			if inArg {
				args = append(args, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteRune(c)
			inArg = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote in %q", quote, s)
	}
	if inArg {
		args = append(args, cur.String())
	}
	if len(args) == 0 {
		return nil, errors.New("empty command")
	}
	return args, nil
}
