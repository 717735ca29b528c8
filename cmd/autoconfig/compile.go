package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/yamlscan"
)

func compileCommand() *cli.Command {
	o := &compileOptions{}
	return &cli.Command{
		Use:   "compile (-f ROUTE --endpoints SNAPSHOT | --from-cluster [-n NS] NAME|-f ROUTE) [--output-dir DIR] [-o text|json|yaml] [--base-cart FILE] [--sock-dir DIR] [--dynamic-peers]",
		Short: "render a route's outputs from files, or from the live cluster",
		Long: `
Validates ROUTE with the embedded schema (the same errors as autoconfig vet),
then renders every output the route owns exactly as the controller would
write them:
  <nginx.outputConfigMap>   session_route_<route>.conf  (openresty route file)
  <nginx.outputConfigMap>   peers_<route>.json          (only with --dynamic-peers)
  <cart.outputConfigMap>    config.yaml                 (only with spec.cart)
  <monitor.outputConfigMap> <model>.monitor.conf        (only with spec.monitor)
--dynamic-peers renders as if the routes ConfigMap declared
routing.modelsphere.dev/dynamic-peers: "true" (the consumer's engine takes
peers without a reload): the route file then depends on the spec alone,
and the route's peers go to peers_<route>.json (docs/outputs.md, "Dynamic
peers").
From files: the endpoints come from the snapshot file SNAPSHOT and the CART
base config (whose workers section is rewritten) from --base-cart.
With --from-cluster: the route is the live route NAME (or the file ROUTE,
not applied yet), and the endpoints and the CART base config come from the
live cluster, discovered as the controller discovers them (read-only; see
autoconfig diff for the flags and the RBAC it needs).
Output: -o text (default) prints each output after a header line
"==> namespace/configmap/key <=="; -o json and -o yaml print a list of
{configMap, key, content}; --output-dir DIR writes each output to
DIR/<namespace>/<configmap>/<key> instead. Warnings (e.g. a skipped peer
tier) go to stderr. The snapshot format and the output formats are in
docs/outputs.md. A problem of the snapshot is file:line:column: field:
message; the route, the snapshot and the base config are refused as by vet
when larger than 4 MiB, not UTF-8 or nested deeper than 100 levels.
Exit status: 0 rendered, 1 invalid route, snapshot or base config (or, from
the cluster, a route the controller would not write), 2 usage error.
`,
		Options: o,
		Args:    cobra.ArbitraryArgs,
		Run: func(ctx context.Context, c *cli.Call) error {
			if err := o.validateArgs(c.Args); err != nil {
				return &cli.UsageError{Err: err}
			}
			return runCompile(ctx, o, c)
		},
	}
}

// compileOptions are the flags of `autoconfig compile`.
type compileOptions struct {
	cluster     clusterOptions
	fromCluster bool
	route       string
	endpoints   string
	outDir      string
	output      string
	baseCart    string
}

func (o *compileOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVarP(&o.route, "file", "f", "", "ModelRoute YAML file `ROUTE` (one document; - for stdin)")
	fs.StringVar(&o.endpoints, "endpoints", "", "endpoint snapshot YAML file `SNAPSHOT` (format: docs/outputs.md)")
	fs.StringVar(&o.outDir, "output-dir", "", "write each output to `DIR`/<namespace>/<configmap>/<key> instead of stdout")
	fs.StringVarP(&o.output, "output", "o", "text", "output format on stdout: text, json or yaml")
	fs.StringVar(&o.baseCart, "base-cart", "", "the CART chart's config.yaml whose workers section is rewritten (required when the route sets spec.cart, without --from-cluster)")
	fs.BoolVar(&o.fromCluster, "from-cluster", false, "discover the endpoints (and the CART base config) in the live cluster as the controller does")
	o.cluster.addFlags(fs, false)
}

func (o *compileOptions) Validate() error {
	if err := checkOutput(o.output); err != nil {
		return fmt.Errorf("%w; write files with --output-dir DIR", err)
	}
	if o.fromCluster {
		if o.endpoints != "" || o.baseCart != "" {
			return errors.New("--from-cluster reads the endpoints and the CART base config from the cluster: drop --endpoints and --base-cart")
		}
		return nil
	}
	if o.route == "" {
		return errors.New("-f ROUTE is required (or --from-cluster NAME)")
	}
	if o.endpoints == "" {
		return errors.New("--endpoints SNAPSHOT is required (or --from-cluster)")
	}
	if o.endpoints == "-" && o.route == "-" {
		return errors.New("-f and --endpoints cannot both read stdin")
	}
	return nil
}

func (o *compileOptions) validateArgs(args []string) error {
	switch {
	case !o.fromCluster && len(args) > 0:
		return fmt.Errorf("unexpected argument %q: a route NAME needs --from-cluster", args[0])
	case o.fromCluster && o.route == "" && len(args) != 1:
		return errors.New("--from-cluster needs one route: NAME or -f ROUTE")
	case o.fromCluster && o.route != "" && len(args) > 0:
		return errors.New("give a route NAME or -f ROUTE, not both")
	}
	return nil
}

// compiled is one rendered output (-o json|yaml).
type compiled struct {
	ConfigMap string `json:"configMap"`
	Key       string `json:"key"`
	Content   string `json:"content"`
}

// runCompile renders the outputs of one route; an invalid route is
// reported and the result is exit status 1.
func runCompile(ctx context.Context, o *compileOptions, c *cli.Call) error {
	var outs []compiled
	var err error
	if o.fromCluster {
		outs, err = compileFromCluster(ctx, o, c)
	} else {
		outs, err = compileFromFiles(o, c.Stdin, c.Stderr)
	}
	if err != nil {
		return err
	}
	return writeCompiled(o, outs, c.Stdout)
}

// compileFromFiles renders from the route and snapshot files.
func compileFromFiles(o *compileOptions, stdin io.Reader, stderr io.Writer) ([]compiled, error) {
	src, name, err := readInput(o.route, stdin)
	if err != nil {
		return nil, err
	}
	v, err := schema.Default()
	if err != nil {
		return nil, err
	}
	docs := v.ValidateStream(name, src)
	if len(docs) != 1 {
		return nil, fmt.Errorf("%s: want exactly one ModelRoute document, found %d", name, len(docs))
	}
	route, err := docs[0].Route, docs[0].Err
	if err == nil && route == nil {
		return nil, fmt.Errorf("%s: %s is not a ModelRoute", name, docs[0].OtherKind)
	}
	if err != nil {
		var inv *schema.InvalidError
		if errors.As(err, &inv) {
			for _, p := range inv.Problems {
				fmt.Fprintln(stderr, p.String())
			}
			return nil, cli.ExitCode(1)
		}
		return nil, err
	}
	// A canary on the stable version's Service: refused as by vet.
	if p, same := canaryOnStable(docs[0]); same {
		fmt.Fprintln(stderr, p.String())
		return nil, cli.ExitCode(1)
	}
	snapSrc, snapName, err := readInput(o.endpoints, stdin)
	if err != nil {
		return nil, err
	}
	snap, err := compiler.ParseSnapshot(snapName, snapSrc)
	if err != nil {
		// file:line:column: field: message, one a line, as for the route
		var se *compiler.SnapshotError
		if errors.As(err, &se) {
			for _, p := range se.Problems {
				fmt.Fprintln(stderr, p)
			}
			return nil, cli.ExitCode(1)
		}
		return nil, err
	}
	res, err := compiler.Compile(&compiler.Route{Name: route.Name, Namespace: route.Namespace, Spec: route.Spec}, discovery.NormalizeSnapshot(snap), o.cluster.compileOptions())
	if err != nil {
		return nil, err
	}
	for _, w := range res.Warnings {
		fmt.Fprintf(stderr, "autoconfig compile: warning: %s\n", w)
	}
	// Render everything before printing or writing anything: a failing
	// output (e.g. a bad base config) leaves no partial result behind.
	out := make([]compiled, len(res.Outputs))
	for i, r := range res.Outputs {
		var current []byte
		if r.Key == compiler.CartKey && route.Spec.Cart != nil {
			if o.baseCart == "" {
				return nil, fmt.Errorf("spec.cart is set: pass the CART chart's config.yaml with --base-cart (autoconfig only rewrites its workers section)")
			}
			if current, err = readBaseCart(o.baseCart); err != nil {
				return nil, err
			}
		}
		b, err := r.Render(current)
		if err != nil {
			return nil, err
		}
		out[i] = compiled{ConfigMap: r.ConfigMap, Key: r.Key, Content: string(b)}
	}
	return out, nil
}

// compileFromCluster renders one route from the live cluster (the
// controller's reconcile steps, read-only).
func compileFromCluster(ctx context.Context, o *compileOptions, c *cli.Call) ([]compiled, error) {
	co := o.cluster
	if o.route != "" {
		co.files = []string{o.route}
	}
	ps, err := co.previews(ctx, c.Args, c.Stdin, c.Stderr)
	if err != nil {
		var code cli.ExitCode
		if errors.As(err, &code) {
			return nil, cli.ExitCode(1) // invalid route, already printed
		}
		return nil, err
	}
	if len(ps) != 1 {
		return nil, fmt.Errorf("%s holds %d routes; compile renders one", o.route, len(ps))
	}
	p := ps[0]
	for _, w := range p.Warnings {
		fmt.Fprintf(c.Stderr, "autoconfig compile: warning: %s\n", w)
	}
	var out []compiled
	for _, po := range p.Outputs {
		switch {
		case po.Removed:
			continue
		case len(po.Refused) > 0:
			for _, rf := range po.Refused {
				fmt.Fprintf(c.Stderr, "autoconfig compile: %s: %s/%s: the controller would not write it: %s\n", p.Route, po.ConfigMap, po.Key, rf)
			}
			continue
		}
		out = append(out, compiled{ConfigMap: po.ConfigMap, Key: po.Key, Content: string(po.Rendered)})
	}
	if len(out) == 0 && len(p.Problems) > 0 {
		for _, pr := range p.Problems {
			fmt.Fprintf(c.Stderr, "autoconfig compile: %s: not ready, the controller writes nothing: %s\n", p.Route, pr)
		}
		return nil, cli.ExitCode(1)
	}
	return out, nil
}

// writeCompiled prints the outputs (-o) or writes them under --output-dir.
func writeCompiled(o *compileOptions, outs []compiled, stdout io.Writer) error {
	if o.outDir == "" {
		if o.output != "text" {
			return printMachine(stdout, o.output, outs)
		}
		for i, out := range outs {
			if i > 0 {
				fmt.Fprintln(stdout)
			}
			fmt.Fprintf(stdout, "==> %s/%s <==\n", out.ConfigMap, out.Key)
			io.WriteString(stdout, out.Content)
		}
		return nil
	}
	for _, out := range outs {
		path := filepath.Join(o.outDir, filepath.FromSlash(out.ConfigMap+"/"+out.Key))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(out.Content), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", path)
	}
	return nil
}

// cartDoc words the messages of a --base-cart file refused before it is
// rendered.
var cartDoc = yamlscan.Doc{Name: "a CART config", Depth: 10, TooLarge: "pass the CART chart's config.yaml", Work: "the memory of rewriting it"}

// cartCounts bounds a --base-cart file: rewriting it (yaml.v3 parses and
// prints the whole file) takes about 1 KB a value, 259 MB for 200 KB of
// nested lists; the CART chart's config.yaml has a few dozen.
var cartCounts = yamlscan.Counts{Entries: 1000, Nodes: 5000}

// readBaseCart reads the --base-cart file, refused like every YAML file
// autoconfig reads when it is too large, not UTF-8, too deeply nested, or
// has more values than cartCounts.
func readBaseCart(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := readLimited(f) // an error names the file (*fs.PathError)
	if err != nil {
		return nil, err
	}
	if err := yamlscan.Check(b, cartDoc); err != nil {
		return nil, fmt.Errorf("--base-cart %s:%w", name, err)
	}
	// A file yaml.v3 cannot parse is the renderer's to report.
	var doc yaml.Node
	if yaml.Unmarshal(b, &doc) == nil {
		if err := yamlscan.Bounds(&doc, cartCounts, cartDoc); err != nil {
			return nil, fmt.Errorf("--base-cart %s:%w", name, err)
		}
	}
	return b, nil
}
