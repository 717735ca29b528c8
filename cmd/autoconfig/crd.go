package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/modelsphere/autoconfig/internal/crdgen"
)

func init() {
	commands["crd"] = command{summary: "print the ModelRoute CustomResourceDefinition (generated from the CUE schema)", run: runCRD}
}

func runCRD(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	var reference bool
	fs, code, ok := parseFlags("crd", args, stderr, joinLines(
		"Usage: autoconfig crd [--reference]",
		"",
		"Prints the ModelRoute CRD (apiextensions.k8s.io/v1) as YAML. Its OpenAPI",
		"schema and CEL validation rules are generated from the embedded CUE",
		"schema, so `kubectl apply` gives the same verdict as `autoconfig vet`.",
		"",
		"  autoconfig crd | kubectl apply --server-side -f -",
		"  go run ./cmd/autoconfig crd > deploy/crds/"+crdgen.FileName,
		"",
		"Flags:"), func(fs *flag.FlagSet) {
		fs.BoolVar(&reference, "reference", false, "print the Markdown field reference (docs/reference.md) instead of the CRD")
	})
	if !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "autoconfig crd: unexpected arguments %q\n", fs.Args())
		fs.Usage()
		return 2
	}
	gen := crdgen.YAML
	if reference {
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
