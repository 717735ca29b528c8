package crdgen

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReferenceUpToDate keeps docs/reference.md in step with the schema
// (make generate rewrites it).
func TestReferenceUpToDate(t *testing.T) {
	want, err := Reference()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"spec.discovery.service", "spec.nginx.peers[].use", "spec.nginx.values", "spec.failureMode", "spec.cart.maxLoad"} {
		if !bytes.Contains(want, []byte("`"+f+"`")) {
			t.Errorf("reference has no row for %s", f)
		}
	}
	got, err := os.ReadFile(filepath.Join("..", "..", ReferenceFile))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s is out of date with the schema; run make generate (%v)", ReferenceFile, err)
	}
	if !strings.Contains(string(want), "| yes |") {
		t.Error("no required field marked")
	}
}
