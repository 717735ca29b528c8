package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// TestRateLimitsApplyWithKubeconfig: a kubeconfig file used to leave
// client-go's silent default of 5 QPS in place; the flags' limits apply to
// every way of finding the API server.
func TestRateLimitsApplyWithKubeconfig(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args  []string
		qps   float32
		burst int
	}{
		{nil, DefaultKubeAPIQPS, DefaultKubeAPIBurst},
		{[]string{"--kube-api-qps=7", "--kube-api-burst=9"}, 7, 9},
	} {
		o := &controllerOptions{}
		fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.AddFlags(fs)
		if err := fs.Parse(append([]string{"--kubeconfig", kc}, c.args...)); err != nil {
			t.Fatal(err)
		}
		if err := o.Validate(); err != nil {
			t.Fatal(err)
		}
		cfg, err := o.restConfig()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.QPS != c.qps || cfg.Burst != c.burst {
			t.Errorf("%v: QPS %v burst %d, want %v %d", c.args, cfg.QPS, cfg.Burst, c.qps, c.burst)
		}
	}
	o := &controllerOptions{sockDir: "/s", maxConcurrent: 1, qps: 0, burst: 1}
	if err := o.Validate(); err == nil {
		t.Error("--kube-api-qps 0 accepted")
	}
}

// parseControllerFlags parses args into fresh options and validates them.
func parseControllerFlags(t *testing.T, args ...string) (*controllerOptions, error) {
	t.Helper()
	o := &controllerOptions{}
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	return o, o.Validate()
}

// TestLeaderElectionFlags: the Lease timings are flags, default to
// controller-runtime's, and are refused unless 0 < retry × 1.2 < renew <
// lease (what client-go's leader elector requires, checked at usage
// instead of when the manager starts).
func TestLeaderElectionFlags(t *testing.T) {
	o, err := parseControllerFlags(t)
	if err != nil {
		t.Fatal(err)
	}
	if o.leaseDuration != 15*time.Second || o.renewDeadline != 10*time.Second || o.retryPeriod != 2*time.Second {
		t.Errorf("defaults %v/%v/%v, want 15s/10s/2s", o.leaseDuration, o.renewDeadline, o.retryPeriod)
	}
	o, err = parseControllerFlags(t, "--leader-elect-lease-duration=30s", "--leader-elect-renew-deadline=20s", "--leader-elect-retry-period=4s")
	if err != nil {
		t.Fatal(err)
	}
	if o.leaseDuration != 30*time.Second || o.renewDeadline != 20*time.Second || o.retryPeriod != 4*time.Second {
		t.Errorf("got %v/%v/%v, want 30s/20s/4s", o.leaseDuration, o.renewDeadline, o.retryPeriod)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--leader-elect-lease-duration=0s"}, "must be positive"},
		{[]string{"--leader-elect-renew-deadline=-1s"}, "must be positive"},
		{[]string{"--leader-elect-retry-period=0"}, "must be positive"},
		{[]string{"--leader-elect-renew-deadline=15s"}, "--leader-elect-renew-deadline (15s) must be less than --leader-elect-lease-duration (15s)"},
		{[]string{"--leader-elect-lease-duration=8s"}, "must be less than --leader-elect-lease-duration (8s)"},
		{[]string{"--leader-elect-retry-period=10s"}, "--leader-elect-retry-period (10s) must be less than --leader-elect-renew-deadline (10s) / 1.2"},
		{[]string{"--leader-elect-retry-period=9s"}, "--leader-elect-retry-period (9s) must be less than"},
		{[]string{"--leader-elect-lease-duration=soon"}, "invalid argument"},
	} {
		_, err := parseControllerFlags(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one containing %q", c.args, err, c.want)
		}
	}
}
