package crdgen_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelsphere/autoconfig/internal/celcheck"
	"github.com/modelsphere/autoconfig/internal/crdgen"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// TestCRDIsValid runs the API server's own CRD validation: structural
// schema rules and CEL compilation with cost estimates.
func TestCRDIsValid(t *testing.T) {
	res, err := crdgen.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := celcheck.New(res.CRD); err != nil {
		t.Fatal(err)
	}
}

// TestCommittedCRDIsFresh fails when deploy/crds differs from the
// generator's output (the CUE schema changed without regenerating).
func TestCommittedCRDIsFresh(t *testing.T) {
	want, err := crdgen.YAML()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(testbin.Root(t), "deploy", "crds", crdgen.FileName)
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v; generate it: go run ./cmd/autoconfig crd > deploy/crds/%s", err, crdgen.FileName)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := 0; i < len(gl) || i < len(wl); i++ {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Errorf("line %d:\n committed: %s\n generated: %s", i+1, g, w)
				break
			}
		}
		t.Fatalf("%s is stale; regenerate: go run ./cmd/autoconfig crd > deploy/crds/%s", path, crdgen.FileName)
	}
}
