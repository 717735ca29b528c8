package main

import (
	"context"

	"github.com/spf13/pflag"

	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/internal/crdgen"
)

// crdOptions are the flags of `autoconfig crd`.
type crdOptions struct{ reference bool }

func (o *crdOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.reference, "reference", false, "print the Markdown field reference (docs/reference.md) instead of the CRD")
}

func (o *crdOptions) Validate() error { return nil }

func crdCommand() *cli.Command {
	o := &crdOptions{}
	return &cli.Command{
		Use:   "crd [--reference]",
		Short: "print the ModelRoute CustomResourceDefinition (generated from the CUE schema)",
		Long: `
Prints the ModelRoute CRD (apiextensions.k8s.io/v1) as YAML. Its OpenAPI
schema and CEL validation rules are generated from the embedded CUE
schema, so ` + "`kubectl apply`" + ` gives the same verdict as ` + "`autoconfig vet`" + `.

  autoconfig crd | kubectl apply --server-side -f -
  go run ./cmd/autoconfig crd > deploy/crds/` + crdgen.FileName + `
`,
		Options: o,
		Run: func(_ context.Context, c *cli.Call) error {
			gen := crdgen.YAML
			if o.reference {
				gen = crdgen.Reference
			}
			b, err := gen()
			if err != nil {
				return err
			}
			_, err = c.Stdout.Write(b)
			return err
		},
	}
}
