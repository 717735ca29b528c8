// Package sidecar holds the flag and logging plumbing the sidecar binaries
// (reload, hagate, readyz) share: every flag also settable from a PS_
// environment variable, a repeatable port-list flag, and the
// --log-level/--log-format slog logger. It imports nothing heavy, so the
// sidecars stay small.
package sidecar

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
)

// EnvPrefix starts every sidecar environment variable. It is not a name a
// Kubernetes Service link could inject (those end in _PORT, _SERVICE_HOST…
// of a Service's upper-cased name).
const EnvPrefix = "PS_"

// EnvName is PS_ + the flag name in upper snake case, unless overrides
// names the variable for that flag.
func EnvName(flagName string, overrides map[string]string) string {
	if e, ok := overrides[flagName]; ok {
		return e
	}
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// ApplyEnv sets every flag not given on the command line from its
// environment variable (named by envName). Call it after fs.Parse: explicit
// flags win. Every bad value is reported, naming the variable.
func ApplyEnv(fs *flag.FlagSet, lookup func(string) (string, bool), envName func(string) string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		name := envName(f.Name)
		v, ok := lookup(name)
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
		}
	})
	return errors.Join(errs...)
}

// PortList is a repeatable flag of TCP ports; one value may also be a
// comma-separated list (the environment form). Range and duplicate checks
// are the caller's (see readiness.ValidatePorts).
type PortList struct{ Ports *[]int }

func (p PortList) String() string {
	if p.Ports == nil {
		return ""
	}
	s := make([]string, len(*p.Ports))
	for i, v := range *p.Ports {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

// Set appends the port(s) in v.
func (p PortList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return fmt.Errorf("port %q is not a number", f)
		}
		*p.Ports = append(*p.Ports, n)
	}
	return nil
}

// ParseLogLevel maps --log-level (debug, info, warn, error) to a level.
func ParseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: use debug, info, warn or error", s)
	}
	return l, nil
}

// ValidateLogFormat checks --log-format.
func ValidateLogFormat(s string) error {
	if s != "text" && s != "json" {
		return fmt.Errorf("--log-format %q: use text or json", s)
	}
	return nil
}

// NewLogger builds the slog logger for --log-level and --log-format
// (already validated; an unknown level falls back to info).
func NewLogger(level, format string, w io.Writer) *slog.Logger {
	lvl, _ := ParseLogLevel(level)
	ho := &slog.HandlerOptions{Level: lvl}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, ho))
	}
	return slog.New(slog.NewTextHandler(w, ho))
}
