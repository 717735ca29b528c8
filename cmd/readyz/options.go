package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/modelsphere/autoconfig/internal/readiness"
	"github.com/modelsphere/autoconfig/internal/sidecar"
)

const (
	defaultListen = ":9404"
	// maxCacheTTL keeps a typo (1h for 1s) from freezing readiness.
	maxCacheTTL = time.Minute
)

// envNames are the environment variables whose names are not simply PS_
// plus the flag in upper snake case: the repeatable flag takes a
// comma-separated list, so its variable is plural.
var envNames = map[string]string{
	"readiness-required-listener": "PS_READINESS_REQUIRED_LISTENERS",
}

// envName is the variable that sets the flag called name. None of them
// ends in _PORT or _SERVICE_HOST, so a Kubernetes service link cannot
// inject one.
func envName(name string) string { return sidecar.EnvName(name, envNames) }

// options are the readyz settings.
type options struct {
	Listen    string
	Ports     []int
	ProcRoot  string
	CacheTTL  time.Duration
	LogLevel  string
	LogFormat string
}

// AddFlags registers every option on fs with its default.
func (o *options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Listen, "listen", defaultListen, "`address` serving /readyz, /health, /healthz and /metrics (port 0 picks a free port, logged at start)")
	fs.Var(sidecar.PortList{Ports: &o.Ports}, "readiness-required-listener", "TCP `port` (1-65535) that must have a LISTEN socket in this pod's network namespace for /readyz to answer 200, e.g. 15008 for Istio ambient; repeatable, at most 16, no duplicates; none means always ready")
	fs.StringVar(&o.ProcRoot, "proc-root", readiness.DefaultProcRoot, "procfs mount `dir`: <dir>/net/tcp and <dir>/net/tcp6 are read (point it at fixtures to test)")
	fs.DurationVar(&o.CacheTTL, "cache-ttl", readiness.DefaultTTL, "how long one scan of the socket tables answers /readyz (0 < ttl <= 1m)")
	fs.StringVar(&o.LogLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.StringVar(&o.LogFormat, "log-format", "text", "log `format`: text or json")
}

// Validate reports every problem at once; the caller exits 2.
func (o *options) Validate() error {
	var errs []error
	if o.Listen == "" {
		errs = append(errs, errors.New("--listen is empty"))
	}
	if err := readiness.ValidatePorts(o.Ports); err != nil {
		errs = append(errs, fmt.Errorf("--readiness-required-listener: %w", err))
	}
	if o.ProcRoot == "" {
		errs = append(errs, errors.New("--proc-root is empty"))
	}
	if o.CacheTTL <= 0 || o.CacheTTL > maxCacheTTL {
		errs = append(errs, fmt.Errorf("--cache-ttl %v: must be above 0 and at most %v", o.CacheTTL, maxCacheTTL))
	}
	if _, err := sidecar.ParseLogLevel(o.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if err := sidecar.ValidateLogFormat(o.LogFormat); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// newLogger builds the --log-level/--log-format logger writing to w.
func (o *options) newLogger(w io.Writer) *slog.Logger {
	return sidecar.NewLogger(o.LogLevel, o.LogFormat, w)
}

const usageHeader = `Usage: readyz [flags]

readyz gates a pod's readiness on required local TCP listeners (such as Istio
ambient's HBONE port 15008), read from <proc-root>/net/tcp and tcp6.

  GET /readyz   200 {"status":"ready"}, or 503 {"status":"not ready","missingListeners":[...]}
                while a required port has no LISTEN socket. Fails open (200) when
                a socket table cannot be read. Results are cached for --cache-ttl.
  GET /health   always 200 (liveness); /healthz is the same.
  GET /metrics  Prometheus metrics (autoconfig_readyz_*).

Point the readiness probe at /readyz and keep liveness on /health.
Every flag can also be set from the environment variable shown; a flag on the
command line wins over its variable.

Flags:
`

// usage prints the help text to w.
func usage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprint(w, usageHeader)
	fs.VisitAll(func(f *flag.Flag) {
		arg, text := flag.UnquoteUsage(f)
		if _, ok := f.Value.(sidecar.PortList); ok {
			arg = "port"
		}
		line := "  --" + f.Name
		if arg != "" {
			line += " " + arg
		}
		fmt.Fprintf(w, "%s\n      %s\n", line, text)
		if f.DefValue != "" {
			fmt.Fprintf(w, "      default: %s\n", f.DefValue)
		}
		env := envName(f.Name)
		if _, ok := f.Value.(sidecar.PortList); ok {
			env += " (comma-separated list)"
		}
		fmt.Fprintf(w, "      env: %s\n", env)
	})
}

// parseOptions parses args and the environment. ok is false when the
// process should exit with code (0 for --help, 2 for a usage error).
func parseOptions(args []string, lookup func(string) (string, bool), stdout, stderr io.Writer) (o *options, code int, ok bool) {
	o = &options{}
	fs := flag.NewFlagSet("readyz", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are printed below, once
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(fs, stdout)
			return nil, 0, false
		}
		fmt.Fprintf(stderr, "readyz: %v\nRun 'readyz --help' for usage.\n", err)
		return nil, 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "readyz: unexpected arguments %q\nRun 'readyz --help' for usage.\n", fs.Args())
		return nil, 2, false
	}
	if err := sidecar.ApplyEnv(fs, lookup, envName); err != nil {
		fmt.Fprintf(stderr, "readyz: %v\n", err)
		return nil, 2, false
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintf(stderr, "readyz: %v\n", err)
		return nil, 2, false
	}
	return o, 0, true
}
