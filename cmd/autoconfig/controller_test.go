package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"

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
