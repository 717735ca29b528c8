package crdgen_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/modelsphere/autoconfig/internal/celcheck"
	"github.com/modelsphere/autoconfig/internal/crdgen"
	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/schema"
)

func sample(b *testing.B) ([]byte, map[string]any) {
	b.Helper()
	src, err := os.ReadFile(filepath.Join(testbin.Root(b), "deploy", "samples", "modelroute-llm.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	obj, err := decode(src)
	if err != nil {
		b.Fatal(err)
	}
	return src, obj
}

// BenchmarkJudgeCUE: one route through the CUE schema.
func BenchmarkJudgeCUE(b *testing.B) {
	src, _ := sample(b)
	v, err := schema.Default()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := v.Validate("llm.yaml", src); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkJudgeCRDInProcess: one route through the CRD's structural
// schema and CEL rules, without an API server.
func BenchmarkJudgeCRDInProcess(b *testing.B) {
	_, obj := sample(b)
	res, err := crdgen.Generate()
	if err != nil {
		b.Fatal(err)
	}
	v, err := celcheck.New(res.CRD)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for b.Loop() {
		if errs := v.Validate(ctx, deepCopy(obj)); len(errs) > 0 {
			b.Fatal(errs.ToAggregate())
		}
	}
}

// BenchmarkGenerate: CUE schema → CRD.
func BenchmarkGenerate(b *testing.B) {
	for b.Loop() {
		if _, err := crdgen.YAML(); err != nil {
			b.Fatal(err)
		}
	}
}
