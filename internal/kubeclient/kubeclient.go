// Package kubeclient is the one kubeconfig loader of every binary that
// talks to the API server: the controller, `autoconfig diff` and
// `autoconfig compile --from-cluster`, hagate, reload in API mode, and the
// hack tools. It imports client-go only.
package kubeclient

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/homedir"
)

// Load returns the REST config of a kubeconfig context and the namespace
// it names:
//
//   - the kubeconfig is the file kubeconfig names (the --kubeconfig flag),
//     else the files $KUBECONFIG lists (merged, the first to set a value
//     wins), else ~/.kube/config;
//   - context picks one of its contexts; "" means its current context, and
//     a name it does not have is an error that lists the ones it has;
//   - with no kubeconfig to read (none named, $KUBECONFIG unset or naming
//     no file, no ~/.kube/config), it is the pod's service account
//     (in-cluster), whose namespace is the pod's.
//
// The namespace is "default" when the context sets none. Errors say which
// source failed.
func Load(kubeconfig, context string) (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	if os.Getenv(clientcmd.RecommendedConfigPathEnvVar) == "" {
		// client-go reads $HOME once, when it starts; read it now.
		rules.Precedence = []string{homeFile()}
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context})
	if context != "" {
		raw, err := cc.RawConfig()
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", source(kubeconfig), err)
		}
		if _, ok := raw.Contexts[context]; !ok {
			names := make([]string, 0, len(raw.Contexts))
			for n := range raw.Contexts {
				names = append(names, n)
			}
			slices.Sort(names)
			has := "no contexts"
			if len(names) > 0 {
				has = "contexts: " + strings.Join(names, ", ")
			}
			return nil, "", fmt.Errorf("context %q not found in %s (%s)", context, source(kubeconfig), has)
		}
	}
	cfg, err := cc.ClientConfig()
	switch {
	case err == nil:
	case clientcmd.IsEmptyConfig(err):
		// client-go's own words suggest KUBERNETES_MASTER; say why the
		// pod's service account could not be used instead.
		if _, icErr := rest.InClusterConfig(); icErr != nil {
			err = icErr
		}
		return nil, "", fmt.Errorf("no kubeconfig (--kubeconfig, $%s or %s) and not in a cluster: %w",
			clientcmd.RecommendedConfigPathEnvVar, homeFile(), err)
	default:
		return nil, "", fmt.Errorf("%s: %w", source(kubeconfig), err)
	}
	ns, _, err := cc.Namespace()
	if err != nil || ns == "" {
		ns = "default"
	}
	return cfg, ns, nil
}

// Config is Load without the namespace.
func Config(kubeconfig, context string) (*rest.Config, error) {
	cfg, _, err := Load(kubeconfig, context)
	return cfg, err
}

// homeFile is ~/.kube/config.
func homeFile() string {
	return filepath.Join(homedir.HomeDir(), clientcmd.RecommendedHomeDir, clientcmd.RecommendedFileName)
}

// source names where the kubeconfig was read from, for errors.
func source(kubeconfig string) string {
	switch {
	case kubeconfig != "":
		return "--kubeconfig " + kubeconfig
	case os.Getenv(clientcmd.RecommendedConfigPathEnvVar) != "":
		return "$" + clientcmd.RecommendedConfigPathEnvVar + " " + os.Getenv(clientcmd.RecommendedConfigPathEnvVar)
	default:
		return homeFile()
	}
}
