// Package kubeclient builds the client-go REST config of every binary that
// talks to the API server (the controller, hagate, and reload in API mode)
// from one --kubeconfig flag. It imports client-go only.
package kubeclient

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Config returns the REST config of the kubeconfig file when one is named,
// otherwise the one fallback finds: InCluster for the sidecars (they always
// run inside the pod they serve), controller-runtime's GetConfig for the
// controller ($KUBECONFIG, the in-cluster service account, ~/.kube/config).
// Errors name the flag or the source.
func Config(kubeconfig string, fallback func() (*rest.Config, error)) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig: %w", err)
		}
		return cfg, nil
	}
	return fallback()
}

// InCluster is the pod's service account config.
func InCluster() (*rest.Config, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster config (give --kubeconfig outside a cluster): %w", err)
	}
	return cfg, nil
}
