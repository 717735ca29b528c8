package cli

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
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

// builtin flags cobra adds; no environment variable sets them.
func builtin(name string) bool { return name == "help" || name == "version" }

// ApplyEnv sets every flag not given on the command line from its
// environment variable (named by envName). Call it after parsing: explicit
// flags win. Every bad value is reported, naming the variable.
func ApplyEnv(fs *pflag.FlagSet, lookup func(string) (string, bool), envName func(string) string) error {
	given := map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if given[f.Name] || builtin(f.Name) {
			return
		}
		name := envName(f.Name)
		v, ok := lookup(name)
		if !ok {
			return
		}
		// f.Value.Set, not fs.Set: the error names the variable, not a flag.
		if err := f.Value.Set(v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
		}
	})
	return errors.Join(errs...)
}

// listValue marks the repeatable flags whose one value may also be a
// comma-separated list (the environment form).
type listValue interface {
	pflag.Value
	commaSeparated()
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

// Type names the value in --help.
func (PortList) Type() string    { return "port" }
func (PortList) commaSeparated() {}

// StringList is a repeatable string flag; one value may also be a
// comma-separated list. Empty parts are dropped.
type StringList struct{ Values *[]string }

func (l StringList) String() string {
	if l.Values == nil {
		return ""
	}
	return strings.Join(*l.Values, ",")
}

// Set appends the part(s) of v.
func (l StringList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l.Values = append(*l.Values, s)
		}
	}
	return nil
}

// Type names the value in --help.
func (StringList) Type() string    { return "strings" }
func (StringList) commaSeparated() {}
