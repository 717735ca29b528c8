// Package testenv starts a real Kubernetes control plane (etcd +
// kube-apiserver, via controller-runtime's envtest) with the ModelRoute CRD
// installed from deploy/crds, for tests.
//
// Binaries come from $KUBEBUILDER_ASSETS, else from
// <module root>/.cache/envtest/v1.37.2, which `make envtest` (bash
// hack/envtest.sh) builds. Missing binaries are a test failure with that
// hint, never a skip.
//
// Start one environment per test package (in TestMain with StartForMain,
// or once in a test with Start) and share it: start-up takes 2.5–3.5 s,
// and the API server sleeps 2 s on any create within 2 s of a CRD becoming
// Established, so installing CRDs per test costs seconds each time.
package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/modelsphere/autoconfig/internal/testbin"
)

// KubeVersion is the version hack/envtest.sh builds.
const KubeVersion = "v1.37.2"

// CRDDir is the CRD directory, relative to the module root.
const CRDDir = "deploy/crds"

// AssetsDir returns the directory holding kube-apiserver and etcd, or an
// error that says how to build them.
func AssetsDir() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		root, err := testbin.ModuleRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, ".cache", "envtest", KubeVersion)
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if fi, err := os.Stat(filepath.Join(dir, bin)); err != nil || fi.IsDir() {
			return "", fmt.Errorf("envtest binary %s not found in %s: run `make envtest` (or `bash hack/envtest.sh`) and set KUBEBUILDER_ASSETS to the directory it prints", bin, dir)
		}
	}
	return dir, nil
}

// Environment returns an envtest.Environment with the binaries and CRDs
// resolved but not started, for callers that need to adjust it.
func Environment() (*envtest.Environment, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	root, err := testbin.ModuleRoot()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(root, CRDDir)},
		ErrorIfCRDPathMissing: true,
	}
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", ServiceCIDR)
	return env, nil
}

// ServiceCIDR replaces envtest's 10.0.0.0/24 (254 ClusterIPs) with the
// /16 around it: a package's tests share one API server and together
// create more Services than that when run with -count=2. Fixed ClusterIPs
// of the /24 (the cluster scripts use some) stay valid.
const ServiceCIDR = "10.0.0.0/16"

// StartForMain starts a control plane with the CRDs installed, for
// TestMain. Call stop before os.Exit.
func StartForMain() (env *envtest.Environment, cfg *rest.Config, stop func(), err error) {
	env, err = Environment()
	if err != nil {
		return nil, nil, nil, err
	}
	cfg, err = env.Start()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("start envtest (binaries in %s): %w", env.BinaryAssetsDirectory, err)
	}
	stop = func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: stop envtest: %v\n", err)
		}
	}
	return env, cfg, stop, nil
}

// Start starts a control plane with the CRDs installed and stops it when
// the test ends. It fails the test (never skips) when it cannot start.
func Start(tb testing.TB) (*envtest.Environment, *rest.Config) {
	tb.Helper()
	env, cfg, stop, err := StartForMain()
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(stop)
	return env, cfg
}
