package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/modelsphere/autoconfig/internal/crdgen"
)

func init() {
	commands["crd"] = command{summary: "print the ModelRoute CustomResourceDefinition (generated from the CUE schema)", run: runCRD}
}

func runCRD(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("crd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	reference := fs.Bool("reference", false, "print the Markdown field reference (docs/reference.md) instead of the CRD")
	fs.Usage = func() {
		fmt.Fprint(stderr, joinLines(
			"Usage: autoconfig crd [--reference]",
			"",
			"Prints the ModelRoute CRD (apiextensions.k8s.io/v1) as YAML. Its OpenAPI",
			"schema and CEL validation rules are generated from the embedded CUE",
			"schema, so `kubectl apply` gives the same verdict as `autoconfig vet`.",
			"",
			"  autoconfig crd | kubectl apply --server-side -f -",
			"  go run ./cmd/autoconfig crd > deploy/crds/"+crdgen.FileName))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "autoconfig crd: unexpected arguments %q\n", fs.Args())
		fs.Usage()
		return 2
	}
	gen := crdgen.YAML
	if *reference {
		gen = crdgen.Reference
	}
	b, err := gen()
	if err != nil {
		fmt.Fprintf(stderr, "autoconfig crd: %v\n", err)
		return 1
	}
	if _, err := stdout.Write(b); err != nil {
		fmt.Fprintf(stderr, "autoconfig crd: %v\n", err)
		return 1
	}
	return 0
}
