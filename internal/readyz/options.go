package readyz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/pflag"

	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/internal/readiness"
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

// EnvName is the variable that sets the flag called name. None of them
// ends in _PORT or _SERVICE_HOST, so a Kubernetes service link cannot
// inject one.
func EnvName(name string) string { return cli.EnvName(name, envNames) }

// Options are the readyz settings (the log flags are the shared ones of
// internal/cli).
type Options struct {
	Listen   string
	Ports    []int
	ProcRoot string
	CacheTTL time.Duration
}

// AddFlags registers every option on fs with its default.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Listen, "listen", defaultListen, "`address` serving /readyz, /health, /healthz and /metrics (port 0 picks a free port, logged at start)")
	fs.Var(cli.PortList{Ports: &o.Ports}, "readiness-required-listener", "TCP `port` (1-65535) that must have a LISTEN socket in this pod's network namespace for /readyz to answer 200, e.g. 15008 for Istio ambient; repeatable, at most 16, no duplicates; none means always ready")
	fs.StringVar(&o.ProcRoot, "proc-root", readiness.DefaultProcRoot, "procfs mount `dir`: <dir>/net/tcp and <dir>/net/tcp6 are read (point it at fixtures to test)")
	fs.DurationVar(&o.CacheTTL, "cache-ttl", readiness.DefaultTTL, "how long one scan of the socket tables answers /readyz (0 < ttl <= 1m)")
}

// Validate reports every problem at once; the caller exits 2.
func (o *Options) Validate() error {
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
	return errors.Join(errs...)
}

const help = `
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

Exit status: 0 after a clean shutdown (SIGTERM), 1 on a runtime error, 2 on a
usage error.
`

// Command is the readyz binary; run is Run outside tests.
func Command(run func(context.Context, *Options, *slog.Logger) error) *cli.Command {
	return cli.Sidecar("readyz [flags]", help, EnvName, run)
}
