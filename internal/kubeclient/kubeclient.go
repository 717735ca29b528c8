// Package kubeclient builds the client-go REST config of every binary that
// talks to the API server (the controller, hagate, and reload in API mode)
// from one --kubeconfig flag. It imports client-go only.
package kubeclient

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Fallback says where the config comes from when no kubeconfig file is
// named.
type Fallback int

const (
	// InCluster uses the pod's service account only (the sidecars: they
	// always run inside the pod they serve).
	InCluster Fallback = iota
	// Discover follows controller-runtime's order: $KUBECONFIG if set,
	// else the in-cluster service account, else ~/.kube/config; client-side
	// rate limiting is then left to API priority and fairness (QPS -1).
	Discover
)

// Config returns the REST config of the kubeconfig file when one is named,
// otherwise the one fallback finds. Errors name the flag or the source.
func Config(kubeconfig string, fallback Fallback) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig: %w", err)
		}
		return cfg, nil
	}
	if fallback == InCluster {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (give --kubeconfig outside a cluster): %w", err)
		}
		return cfg, nil
	}
	cfg, err := discover()
	if err != nil {
		return nil, err
	}
	if cfg.QPS == 0 {
		cfg.QPS = -1
	}
	return cfg, nil
}

func discover() (*rest.Config, error) {
	if os.Getenv(clientcmd.RecommendedConfigPathEnvVar) == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return cfg, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if _, ok := os.LookupEnv("HOME"); !ok {
		if u, err := user.Current(); err == nil {
			rules.Precedence = append(rules.Precedence, filepath.Join(u.HomeDir, clientcmd.RecommendedHomeDir, clientcmd.RecommendedFileName))
		}
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
}
