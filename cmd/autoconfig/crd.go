package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/internal/crdgen"
)

// crdOptions are the flags of `autoconfig crd`.
type crdOptions struct{ reference, jsonSchema, openAPI bool }

func (o *crdOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.reference, "reference", false, "print the Markdown field reference (docs/reference.md) instead of the CRD")
	fs.BoolVar(&o.jsonSchema, "json-schema", false, "print the ModelRoute JSON Schema (for editors and kubeconform; deploy/schemas/"+crdgen.JSONSchemaFile+") instead of the CRD")
	fs.BoolVar(&o.openAPI, "openapi", false, "print an OpenAPI 3.0 document with the ModelRoute schema (deploy/schemas/"+crdgen.OpenAPIFile+") instead of the CRD")
}

func (o *crdOptions) Validate() error {
	n := 0
	for _, b := range []bool{o.reference, o.jsonSchema, o.openAPI} {
		if b {
			n++
		}
	}
	if n > 1 {
		return fmt.Errorf("--reference, --json-schema and --openapi: give one")
	}
	return nil
}

func crdCommand() *cli.Command {
	o := &crdOptions{}
	return &cli.Command{
		Use:   "crd [--reference | --json-schema | --openapi]",
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
			switch {
			case o.reference:
				gen = crdgen.Reference
			case o.jsonSchema:
				gen = crdgen.JSONSchema
			case o.openAPI:
				gen = crdgen.OpenAPI
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
