package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/pmezard/go-difflib/difflib"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/internal/controller"
	"github.com/modelsphere/autoconfig/internal/kubeclient"
	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// clusterOptions are the flags of the commands that read a live cluster
// (diff, compile --from-cluster): which routes and how to reach them.
type clusterOptions struct {
	kubeconfig    string
	context       string
	namespace     string
	allNamespaces bool
	files         []string
	trusted       []string
	watched       []string
	sockDir       string
	dynamicPeers  bool
}

// addFlags registers the flags; withFile adds -f (compile has its own).
func (o *clusterOptions) addFlags(fs *pflag.FlagSet, withFile bool) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the in-cluster service account)")
	fs.StringVar(&o.context, "context", "", "kubeconfig context (default: the current one)")
	fs.StringVarP(&o.namespace, "namespace", "n", "", "namespace of the routes (default: the context's namespace, else default)")
	fs.BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "every route of every namespace")
	if withFile {
		fs.StringArrayVarP(&o.files, "file", "f", nil, "ModelRoute YAML `FILE` not applied yet (- for stdin; repeatable): previewed as if applied")
	}
	fs.StringSliceVar(&o.trusted, "trusted-namespace", nil, "the controller's --trusted-namespace values (grants are checked as the controller checks them)")
	fs.StringSliceVar(&o.watched, "watch-namespace", nil, "the controller's --namespace values (Helm value watchNamespaces; default: all): a route that references another namespace is reported as the controller reports it")
	fs.StringVar(&o.sockDir, "sock-dir", compiler.DefaultSockDir, "directory of the per-route unix sockets in the openresty image (the controller's --sock-dir)")
	fs.BoolVar(&o.dynamicPeers, "dynamic-peers", false, "render as if the routes ConfigMap declared "+peers.Annotation+": \"true\": the route file holds no peers, they go to the key peers_<route>.json")
}

// compileOptions are the compiler options the flags select.
func (o *clusterOptions) compileOptions() compiler.Options {
	return compiler.Options{SockDir: o.sockDir, DynamicPeers: o.dynamicPeers}
}

// restConfig is the kubeconfig's REST config, with the controller's
// client rate limits, and the namespace routes default to. diff and
// compile --from-cluster read a few objects a route, one route after
// another: at client-go's default, 5 QPS, a file of 100 routes took 56 s
// of which 0.8 s of CPU (the pacing is the API server's Priority and
// Fairness, as for the controller).
func (o *clusterOptions) restConfig() (*rest.Config, string, error) {
	cfg, contextNS, err := kubeclient.Load(o.kubeconfig, o.context)
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = DefaultKubeAPIQPS, DefaultKubeAPIBurst
	ns := o.namespace
	if ns == "" {
		ns = contextNS
	}
	return cfg, ns, nil
}

// client builds the live client and the namespace routes default to.
func (o *clusterOptions) client() (client.Client, string, error) {
	cfg, ns, err := o.restConfig()
	if err != nil {
		return nil, "", err
	}
	scheme, err := routeScheme()
	if err != nil {
		return nil, "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", fmt.Errorf("client: %w", err)
	}
	return c, ns, nil
}

// routeScheme is client-go's kinds plus the ModelRoute.
func routeScheme() (*k8sruntime.Scheme, error) {
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, nil
}

// routes resolves the command's routes: -f files (validated, with their
// file:line problems), else the named routes, else every route of the
// namespace (or of all with -A).
func (o *clusterOptions) routes(ctx context.Context, c client.Client, ns string, names []string, stdin io.Reader, stderr io.Writer) ([]*v1alpha1.ModelRoute, error) {
	var out []*v1alpha1.ModelRoute
	if len(o.files) > 0 {
		v, err := schema.Default()
		if err != nil {
			return nil, err
		}
		invalid := false
		for _, f := range o.files {
			src, name, err := readInput(f, stdin)
			if err != nil {
				return nil, err
			}
			for _, d := range v.ValidateStream(name, src) {
				if d.OtherKind != "" {
					continue
				}
				var inv *schema.InvalidError
				if errors.As(d.Err, &inv) {
					for _, p := range inv.Problems {
						fmt.Fprintln(stderr, p.String())
					}
					invalid = true
					continue
				}
				if d.Err != nil {
					return nil, d.Err
				}
				rt := d.Route.DeepCopy()
				if rt.Namespace == "" {
					rt.Namespace = ns
				}
				// A route in the cluster under the same name keeps its
				// status: the keys it holds are what the file would
				// replace or remove.
				var live v1alpha1.ModelRoute
				if err := c.Get(ctx, client.ObjectKeyFromObject(rt), &live); err == nil {
					rt.Status = live.Status
					rt.UID = live.UID
				}
				out = append(out, rt)
			}
		}
		if invalid {
			return nil, cli.ExitCode(2)
		}
		return out, nil
	}
	if len(names) > 0 {
		for _, n := range names {
			var rt v1alpha1.ModelRoute
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: n}, &rt); err != nil {
				return nil, fmt.Errorf("get modelroute %s/%s: %w", ns, n, err)
			}
			out = append(out, &rt)
		}
		return out, nil
	}
	var l v1alpha1.ModelRouteList
	opts := []client.ListOption{}
	if !o.allNamespaces {
		opts = append(opts, client.InNamespace(ns))
	}
	if err := c.List(ctx, &l, opts...); err != nil {
		return nil, fmt.Errorf("list modelroutes: %w", err)
	}
	for i := range l.Items {
		if l.Items[i].DeletionTimestamp.IsZero() {
			out = append(out, &l.Items[i])
		}
	}
	return out, nil
}

// previews runs the controller's reconcile steps, read-only, for every
// route the flags name.
func (o *clusterOptions) previews(ctx context.Context, names []string, stdin io.Reader, stderr io.Writer) ([]*controller.Preview, error) {
	c, ns, err := o.client()
	if err != nil {
		return nil, err
	}
	routes, err := o.routes(ctx, c, ns, names, stdin, stderr)
	if err != nil {
		return nil, err
	}
	v, err := schema.Default()
	if err != nil {
		return nil, err
	}
	pv := controller.NewPreviewer(c, v, o.compileOptions(), o.watched, o.trusted)
	var out []*controller.Preview
	for _, rt := range routes {
		p, err := pv.Preview(ctx, rt)
		if err != nil {
			return nil, fmt.Errorf("route %s/%s: %w", rt.Namespace, rt.Name, err)
		}
		out = append(out, p)
	}
	return out, nil
}

func (o *clusterOptions) validate(args []string) error {
	if len(o.files) > 0 && (len(args) > 0 || o.allNamespaces) {
		return errors.New("-f FILE cannot be combined with route names or -A")
	}
	if o.allNamespaces && (len(args) > 0 || o.namespace != "") {
		return errors.New("-A cannot be combined with route names or -n")
	}
	return nil
}

func diffCommand() *cli.Command {
	o := &diffOptions{}
	return &cli.Command{
		Use:   "diff [NAME ...] [-n NS | -A | -f FILE] [-o text|json|yaml] [--dynamic-peers]",
		Short: "show what the controller would change in the live ConfigMaps",
		Long: `
Runs the controller's own reconcile steps for each route against the live
cluster (the same validation, namespace scope, grants, discovery, compiler
and write guards, with the controller's field indexes evaluated
client-side), with a writer that reads the live ConfigMaps instead of
patching them, and says per output key what the controller would do:
write it (a unified diff against the live content on stdout), remove it,
leave it unchanged, or refuse it. A refusal is printed to stderr with the
reason and message the controller would put in the route's Ready condition
(the owner of a conflicting key, the grant to add, the size, the namespace
to watch). Nothing is written: the command needs only read access
(get/list on modelroutes, services, endpointslices, pods, nodes and
configmaps; the chart's <release>-diff ClusterRole).

Give it the controller's --namespace (as --watch-namespace) and
--trusted-namespace values so that it judges as that controller does.

Routes: the NAMEs in -n NS; every route of NS without NAMEs; every route
with -A; or the routes of -f FILE (not yet applied; a route of the same name
in the cluster lends its status, so keys it would stop rendering show as
removed).

With --dynamic-peers every route renders as if its routes ConfigMap
declared routing.modelsphere.dev/dynamic-peers: "true" (the consumer's
engine takes peers without a reload): the route file holds no peers and
each route has a second key, peers_<route>.json, in that ConfigMap
(docs/outputs.md, "Dynamic peers").

Exit status:
  0  the controller would change nothing and refuse nothing (every route Ready)
  1  it would write or remove keys, and refuse nothing
  2  error (an invalid route, an unreachable cluster, a missing route)
  3  it would refuse or hold back at least one key or route (Ready=False:
     a key owned by another route or written by hand, a ConfigMap that
     does not grant the route's namespace, no backends, ...); the changes
     it would still make are printed too
`,
		Options: o,
		Args:    cobra.ArbitraryArgs,
		Run: func(ctx context.Context, c *cli.Call) error {
			if err := o.validate(c.Args); err != nil {
				return &cli.UsageError{Err: err}
			}
			// diff's exit status 1 means "differences" and 3 "refused":
			// every error, whatever its kind, is 2.
			err := runDiff(ctx, o, c)
			var code cli.ExitCode
			if err != nil && !errors.As(err, &code) {
				fmt.Fprintf(c.Stderr, "autoconfig diff: %v\n", err)
				return cli.ExitCode(2)
			}
			return err
		},
	}
}

// diffOptions are the flags of `autoconfig diff`.
type diffOptions struct {
	clusterOptions
	output string
}

func (o *diffOptions) AddFlags(fs *pflag.FlagSet) {
	o.addFlags(fs, true)
	fs.StringVarP(&o.output, "output", "o", "text", "output format: text (unified diff), json or yaml")
}

func (o *diffOptions) Validate() error {
	if err := checkOutput(o.output); err != nil {
		return err
	}
	return nil
}

// diffKey is one key in -o json.
type diffKey struct {
	ConfigMap string `json:"configMap"`
	Key       string `json:"key"`
	// Change is "create", "update", "remove", "none" or "refused".
	Change string `json:"change"`
	Diff   string `json:"diff,omitempty"`
	// Refused are the reasons the controller would not write the key.
	Refused []diffRefusal `json:"refused,omitempty"`
}

// diffRefusal is one reason in -o json: as the Ready condition says it.
type diffRefusal struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// diffReady is the Ready condition the controller would set.
type diffReady struct {
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// diffRoute is one route in -o json.
type diffRoute struct {
	Route    string    `json:"route"`
	Ready    diffReady `json:"ready"`
	Keys     []diffKey `json:"keys"`
	Problems []string  `json:"problems,omitempty"`
	Warnings []string  `json:"warnings,omitempty"`
}

func runDiff(ctx context.Context, o *diffOptions, c *cli.Call) error {
	ps, err := o.previews(ctx, c.Args, c.Stdin, c.Stderr)
	if err != nil {
		return err
	}
	changed, refused := false, false
	var routes []diffRoute
	for _, p := range ps {
		dr := diffRoute{Route: p.Route, Problems: p.Problems, Warnings: p.Warnings,
			Ready: diffReady{Status: string(p.Ready.Status), Reason: p.Ready.Reason, Message: p.Ready.Message}}
		refused = refused || len(p.Problems) > 0
		for _, out := range p.Outputs {
			k := diffKey{ConfigMap: out.ConfigMap, Key: out.Key, Change: "none"}
			switch {
			case len(out.Refused) > 0:
				k.Change = "refused"
				for _, rf := range out.Refused {
					k.Refused = append(k.Refused, diffRefusal{Reason: rf.Reason, Message: rf.Message})
				}
			case out.Changed():
				changed = true
				k.Change = "update"
				if !out.LiveExists {
					k.Change = "create"
				} else if out.Removed {
					k.Change = "remove"
				}
				k.Diff = unifiedDiff(out)
			}
			dr.Keys = append(dr.Keys, k)
		}
		routes = append(routes, dr)
	}
	if o.output != "text" {
		if err := printMachine(c.Stdout, o.output, routes); err != nil {
			return err
		}
	} else {
		for _, r := range routes {
			for _, w := range r.Warnings {
				fmt.Fprintf(c.Stderr, "autoconfig diff: %s: warning: %s\n", r.Route, w)
			}
			listed := map[string]bool{}
			for _, k := range r.Keys {
				for _, rf := range k.Refused {
					listed[rf.Reason+rf.Message] = true
					fmt.Fprintf(c.Stderr, "autoconfig diff: %s: %s/%s: not written: %s: %s\n", r.Route, k.ConfigMap, k.Key, rf.Reason, rf.Message)
				}
				io.WriteString(c.Stdout, k.Diff)
			}
			// What holds the route back beyond its keys (nothing listed
			// for a key: e.g. an unwatched namespace's ConfigMap).
			for _, p := range r.Problems {
				if reason, msg, _ := strings.Cut(p, ": "); !listed[reason+msg] {
					fmt.Fprintf(c.Stderr, "autoconfig diff: %s: not ready: %s\n", r.Route, p)
				}
			}
		}
	}
	switch {
	case refused:
		return cli.ExitCode(3)
	case changed:
		return cli.ExitCode(1)
	}
	return nil
}

// unifiedDiff is the diff of one key, live (a/) against rendered (b/), as
// git prints it; a missing key is /dev/null.
func unifiedDiff(out controller.PreviewOutput) string {
	loc := out.ConfigMap + "/" + out.Key
	from, to := "a/"+loc, "b/"+loc
	if !out.LiveExists {
		from = "/dev/null"
	}
	if out.Removed {
		to = "/dev/null"
	}
	s, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
		A: lines(out.Live), B: lines(out.Rendered),
		FromFile: from, ToFile: to, Context: 3,
	})
	if err != nil {
		return fmt.Sprintf("--- %s\n+++ %s\n(diff failed: %v)\n", from, to, err)
	}
	return s
}

// lines splits b into lines that keep their newline; a last line without
// one is marked as diff(1) marks it.
func lines(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	ls := strings.SplitAfter(string(b), "\n")
	if ls[len(ls)-1] == "" {
		ls = ls[:len(ls)-1]
	} else {
		ls[len(ls)-1] += "\n\\ No newline at end of file\n"
	}
	return ls
}
