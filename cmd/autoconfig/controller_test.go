package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// TestRateLimitsApplyWithKubeconfig: a kubeconfig file used to leave
// client-go's silent default of 5 QPS in place; the flags' limits apply to
// every way of finding the API server.
func TestRateLimitsApplyWithKubeconfig(t *testing.T) {
	kc := writeTestKubeconfig(t)
	for _, c := range []struct {
		args  []string
		qps   float32
		burst int
	}{
		{nil, DefaultKubeAPIQPS, DefaultKubeAPIBurst},
		{[]string{"--kube-api-qps=7", "--kube-api-burst=9"}, 7, 9},
		{[]string{"--kube-api-qps=-1"}, -1, DefaultKubeAPIBurst},
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
	if _, err := parseControllerFlags(t, "--kube-api-qps=0"); err == nil || !strings.Contains(err.Error(), "--kube-api-qps must not be 0") {
		t.Errorf("--kube-api-qps 0: %v", err)
	}
	if _, err := parseControllerFlags(t, "--kube-api-burst=0"); err == nil || !strings.Contains(err.Error(), "--kube-api-burst must be at least 1") {
		t.Errorf("--kube-api-burst 0: %v", err)
	}
	if _, err := parseControllerFlags(t, "--kube-api-qps=-1", "--kube-api-burst=0"); err != nil {
		t.Errorf("no client-side limit: %v", err)
	}
}

// TestNoClientSideLimit: a negative --kube-api-qps leaves client-go
// without a rate limiter (it builds none for QPS <= 0 when no limiter is
// given), so the API server's Priority and Fairness alone paces requests.
func TestNoClientSideLimit(t *testing.T) {
	o, err := parseControllerFlags(t, "--kube-api-qps=-1")
	if err != nil {
		t.Fatal(err)
	}
	o.kubeconfig = writeTestKubeconfig(t)
	cfg, err := o.restConfig()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := rest.RESTClientFor(withCodec(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if rl := rc.GetRateLimiter(); rl != nil {
		t.Errorf("rate limiter %T with --kube-api-qps=-1, want none", rl)
	}
	o.qps = DefaultKubeAPIQPS
	cfg, err = o.restConfig()
	if err != nil {
		t.Fatal(err)
	}
	if rc, err = rest.RESTClientFor(withCodec(cfg)); err != nil {
		t.Fatal(err)
	}
	if rl := rc.GetRateLimiter(); rl == nil || rl.QPS() != DefaultKubeAPIQPS {
		t.Errorf("rate limiter %v with the default, want %d QPS", rl, DefaultKubeAPIQPS)
	}
}

func withCodec(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.GroupVersion = &corev1.SchemeGroupVersion
	cfg.APIPath = "/api"
	cfg.NegotiatedSerializer = clientgoscheme.Codecs.WithoutConversion()
	return cfg
}

func writeTestKubeconfig(t *testing.T) string {
	t.Helper()
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
	return kc
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

// TestClusterClientLimit: diff and compile --from-cluster use the
// controller's client rate limit, not client-go's default 5 QPS (a file of
// 100 routes took 56 s to diff, 0.8 s of it CPU).
func TestClusterClientLimit(t *testing.T) {
	o := &clusterOptions{kubeconfig: writeTestKubeconfig(t)}
	cfg, _, err := o.restConfig()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := rest.RESTClientFor(withCodec(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if rl := rc.GetRateLimiter(); rl == nil || rl.QPS() != DefaultKubeAPIQPS {
		t.Errorf("rate limiter %v, want %d QPS", rl, DefaultKubeAPIQPS)
	}
}
