package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// deleteRoutesOptions are the flags of `autoconfig delete-routes`.
type deleteRoutesOptions struct {
	kubeconfig string
	selector   string
	namespace  string
	timeout    time.Duration
	interval   time.Duration
}

func (o *deleteRoutesOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the in-cluster service account)")
	fs.StringVarP(&o.selector, "selector", "l", "", "label `SELECTOR` of the routes to delete (required), e.g. app.kubernetes.io/instance=autoconfig")
	fs.StringVarP(&o.namespace, "namespace", "n", "", "only routes in this namespace (default: every namespace)")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "how long to wait for the controller to clean up and release the routes")
	fs.DurationVar(&o.interval, "interval", time.Second, "how often to check")
}

func (o *deleteRoutesOptions) Validate() error {
	if o.selector == "" {
		return errors.New("--selector is required (deleting every route of the cluster is not what this is for)")
	}
	if _, err := labels.Parse(o.selector); err != nil {
		return fmt.Errorf("--selector: %w", err)
	}
	if o.timeout <= 0 || o.interval <= 0 {
		return errors.New("--timeout and --interval must be positive")
	}
	return nil
}

func deleteRoutesCommand() *cli.Command {
	o := &deleteRoutesOptions{}
	return &cli.Command{
		Use:   "delete-routes -l SELECTOR [-n NS] [--timeout 5m]",
		Short: "delete ModelRoutes by label and wait until the controller has removed their keys",
		Long: `
Deletes every ModelRoute matching the label selector and waits until they
are gone: the controller's finalizer removes each route's keys from the
output ConfigMaps first. The Helm chart runs it as a pre-delete hook, so
"helm uninstall" removes the release's modelRoutes while the controller
still runs (deleting the controller first would leave the routes
terminating, with no one to remove their finalizer).
Exit status: 0 all gone, 1 some left at --timeout (they are listed; if the
controller is not running, docs/controller.md has the recovery patch), 2
usage error.
`,
		Options: o,
		Log:     true,
		Run: func(ctx context.Context, c *cli.Call) error {
			cfg, err := (&controllerOptions{kubeconfig: o.kubeconfig, qps: DefaultKubeAPIQPS, burst: DefaultKubeAPIBurst}).restConfig()
			if err != nil {
				return err
			}
			scheme, err := routeScheme()
			if err != nil {
				return err
			}
			k, err := client.New(cfg, client.Options{Scheme: scheme})
			if err != nil {
				return err
			}
			return deleteRoutes(ctx, k, o, c)
		},
	}
}

// deleteRoutes deletes the selected routes and polls until none is left.
func deleteRoutes(ctx context.Context, k client.Client, o *deleteRoutesOptions, c *cli.Call) error {
	sel, _ := labels.Parse(o.selector)
	list := func() ([]string, error) {
		var l v1alpha1.ModelRouteList
		opts := []client.ListOption{client.MatchingLabelsSelector{Selector: sel}}
		if o.namespace != "" {
			opts = append(opts, client.InNamespace(o.namespace))
		}
		if err := k.List(ctx, &l, opts...); err != nil {
			return nil, fmt.Errorf("list modelroutes: %w", err)
		}
		var out []string
		for i := range l.Items {
			r := &l.Items[i]
			out = append(out, r.Namespace+"/"+r.Name)
			if r.DeletionTimestamp.IsZero() {
				if err := k.Delete(ctx, r); client.IgnoreNotFound(err) != nil {
					return nil, fmt.Errorf("delete modelroute %s/%s: %w", r.Namespace, r.Name, err)
				}
				c.Log.Info("deleted route", "route", r.Namespace+"/"+r.Name)
			}
		}
		slices.Sort(out)
		return out, nil
	}
	deadline := time.Now().Add(o.timeout)
	for {
		left, err := list()
		if err != nil {
			return err
		}
		if len(left) == 0 {
			c.Log.Info("every selected route is gone", "selector", o.selector)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s these routes still exist (is the controller running? it removes their keys and finalizer): %s", o.timeout, strings.Join(left, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(o.interval):
		}
	}
}
