package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/schema"
)

func compileCommand() *cli.Command {
	o := &compileOptions{}
	return &cli.Command{
		Use:   "compile -f ROUTE --endpoints SNAPSHOT [-o DIR] [--base-cart FILE] [--sock-dir DIR]",
		Short: "render a route's outputs from a route file and an endpoint snapshot",
		Long: `
Validates ROUTE with the embedded schema (the same errors as autoconfig vet),
then renders every output the route owns from files alone, exactly as the
controller would write them:
  <nginx.outputConfigMap>   session_route_<route>.conf  (openresty route file)
  <cart.outputConfigMap>    config.yaml                 (only with spec.cart; needs --base-cart)
  <monitor.outputConfigMap> <model>.monitor.conf        (only with spec.monitor)
Without -o each output is printed to stdout after a header line
"==> namespace/configmap/key <=="; with -o it is written to
DIR/<namespace>/<configmap>/<key>. Warnings (e.g. a skipped peer tier) go to
stderr. The snapshot format and the output formats are in docs/outputs.md.
Exit status: 0 rendered, 1 invalid route, snapshot or base config, 2 usage error.
`,
		Options: o,
		Run: func(_ context.Context, c *cli.Call) error {
			return runCompile(o, c.Stdin, c.Stdout, c.Stderr)
		},
	}
}

// compileOptions are the flags of `autoconfig compile`.
type compileOptions struct {
	route     string
	endpoints string
	outDir    string
	baseCart  string
	sockDir   string
}

func (o *compileOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVarP(&o.route, "file", "f", "", "ModelRoute YAML file `ROUTE` (one document; - for stdin)")
	fs.StringVar(&o.endpoints, "endpoints", "", "endpoint snapshot YAML file `SNAPSHOT` (format: docs/outputs.md)")
	fs.StringVarP(&o.outDir, "output-dir", "o", "", "write each output to `DIR`/<namespace>/<configmap>/<key> instead of stdout")
	fs.StringVar(&o.baseCart, "base-cart", "", "the CART chart's config.yaml whose workers section is rewritten (required when the route sets spec.cart)")
	fs.StringVar(&o.sockDir, "sock-dir", compiler.DefaultSockDir, "directory of the per-route unix sockets in the openresty image")
}

func (o *compileOptions) Validate() error {
	if o.route == "" {
		return errors.New("-f ROUTE is required")
	}
	if o.endpoints == "" {
		return errors.New("--endpoints SNAPSHOT is required")
	}
	if o.endpoints == "-" && o.route == "-" {
		return errors.New("-f and --endpoints cannot both read stdin")
	}
	return nil
}

// runCompile renders the outputs of o.route; an invalid route is reported
// and the result is exit status 1.
func runCompile(o *compileOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	src, name, err := readInput(o.route, stdin)
	if err != nil {
		return err
	}
	v, err := schema.Default()
	if err != nil {
		return err
	}
	route, err := v.Validate(name, src)
	if err != nil {
		var inv *schema.InvalidError
		if errors.As(err, &inv) {
			for _, p := range inv.Problems {
				fmt.Fprintln(stderr, p.String())
			}
			return cli.ExitCode(1)
		}
		return err
	}
	snapSrc, _, err := readInput(o.endpoints, stdin)
	if err != nil {
		return err
	}
	snap, err := compiler.ParseSnapshot(snapSrc)
	if err != nil {
		return fmt.Errorf("%s: %w", o.endpoints, err)
	}
	res, err := compiler.Compile(&compiler.Route{Name: route.Name, Namespace: route.Namespace, Spec: route.Spec}, discovery.NormalizeSnapshot(snap), compiler.Options{SockDir: o.sockDir})
	if err != nil {
		return err
	}
	for _, w := range res.Warnings {
		fmt.Fprintf(stderr, "autoconfig compile: warning: %s\n", w)
	}
	// Render everything before printing or writing anything: a failing
	// output (e.g. a bad base config) leaves no partial result behind.
	rendered := make([][]byte, len(res.Outputs))
	for i, out := range res.Outputs {
		var current []byte
		if out.Key == compiler.CartKey && route.Spec.Cart != nil {
			if o.baseCart == "" {
				return fmt.Errorf("spec.cart is set: pass the CART chart's config.yaml with --base-cart (autoconfig only rewrites its workers section)")
			}
			if current, err = os.ReadFile(o.baseCart); err != nil {
				return err
			}
		}
		if rendered[i], err = out.Render(current); err != nil {
			return err
		}
	}
	for i, out := range res.Outputs {
		loc := out.ConfigMap + "/" + out.Key
		if o.outDir == "" {
			if i > 0 {
				fmt.Fprintln(stdout)
			}
			fmt.Fprintf(stdout, "==> %s <==\n", loc)
			stdout.Write(rendered[i])
			continue
		}
		path := filepath.Join(o.outDir, filepath.FromSlash(loc))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, rendered[i], 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", path)
	}
	return nil
}
