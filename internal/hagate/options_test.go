package hagate

import (
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/modelsphere/autoconfig/internal/cli"
)

func newFlags() (*Options, *pflag.FlagSet) {
	var o Options
	fs := pflag.NewFlagSet("hagate", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs)
	return &o, fs
}

func TestDefaultsAreValidOnceRequiredFlagsAreSet(t *testing.T) {
	o, fs := newFlags()
	if err := fs.Parse([]string{"--name=router", "--namespace=ns", "--pod-name=p", "--app-port=8080"}); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if o.LeaseName() != "router-ha" || o.LabelKey() != "router-active" {
		t.Fatalf("lease %q label %q", o.LeaseName(), o.LabelKey())
	}
	if o.Interval != 2*time.Second {
		t.Fatalf("interval default %v, want 2s", o.Interval)
	}
}

func TestApplyEnvFlagWins(t *testing.T) {
	o, fs := newFlags()
	if err := fs.Parse([]string{"--name=fromflag", "--readiness-required-listener=1"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"PS_NAME":                         "fromenv",
		"PS_NAMESPACE":                    "ns",
		"PS_APP_PORT_NUMBER":              "8080",
		"PS_APP_PORT":                     "tcp://10.0.0.1:80", // a service link; must be ignored
		"PS_READINESS_REQUIRED_LISTENERS": "2,3",
		"PS_INTERVAL":                     "500ms",
	}
	if err := ApplyEnv(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	if o.Name != "fromflag" || o.Namespace != "ns" || o.AppPort != 8080 || o.Interval != 500*time.Millisecond {
		t.Fatalf("got %+v", o)
	}
	if len(o.RequiredListeners) != 1 || o.RequiredListeners[0] != 1 {
		t.Fatalf("listeners %v: the flag must win over the env", o.RequiredListeners)
	}
}

func TestRepeatableListenerFlag(t *testing.T) {
	o, fs := newFlags()
	if err := fs.Parse([]string{"--readiness-required-listener=15008", "--readiness-required-listener=15001,15006"}); err != nil {
		t.Fatal(err)
	}
	if got := (cli.PortList{Ports: &o.RequiredListeners}).String(); got != "15008,15001,15006" {
		t.Fatalf("listeners %q", got)
	}
}

// Service links inject <SVC>_SERVICE_HOST, <SVC>_SERVICE_PORT[_<NAME>],
// <SVC>_PORT and <SVC>_PORT_<n>_<PROTO>[_PROTO|_PORT|_ADDR] into every pod
// of the namespace; none of our variables may have one of those shapes.
func TestEnvNamesCannotComeFromServiceLinks(t *testing.T) {
	link := regexp.MustCompile(`(_SERVICE_HOST|_SERVICE_PORT(_[A-Z0-9_]+)?|_PORT|_PORT_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$`)
	_, fs := newFlags()
	fs.VisitAll(func(f *pflag.Flag) {
		e := EnvName(f.Name)
		if !strings.HasPrefix(e, "PS_") {
			t.Errorf("%s: env %s lacks the PS_ prefix", f.Name, e)
		}
		if link.MatchString(e) {
			t.Errorf("%s: env %s could be injected by a Service link", f.Name, e)
		}
	})
}

func TestValidateRejects(t *testing.T) {
	base := func() *Options {
		o, fs := newFlags()
		if err := fs.Parse([]string{"--name=router", "--namespace=ns", "--pod-name=p", "--app-port=8080"}); err != nil {
			t.Fatal(err)
		}
		return o
	}
	for name, tc := range map[string]struct {
		mut  func(*Options)
		want string
	}{
		"renew >= lease":  {func(o *Options) { o.RenewDeadline = o.LeaseDuration }, "shorter than --lease-duration"},
		"retry too long":  {func(o *Options) { o.RetryPeriod = o.RenewDeadline }, "1.2 × --retry-period"},
		"fraction lease":  {func(o *Options) { o.LeaseDuration = 15500 * time.Millisecond }, "whole seconds"},
		"zero interval":   {func(o *Options) { o.Interval = 0 }, "must be positive"},
		"dup listener":    {func(o *Options) { o.RequiredListeners = []int{1, 1} }, "twice"},
		"label too long":  {func(o *Options) { o.Name = strings.Repeat("a", 60) }, "label key"},
		"missing podname": {func(o *Options) { o.PodName = "" }, "--pod-name (or PS_POD_NAME) is required"},
	} {
		t.Run(name, func(t *testing.T) {
			o := base()
			tc.mut(o)
			err := o.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
