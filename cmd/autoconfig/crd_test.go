package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelsphere/autoconfig/internal/crdgen"
)

// TestCRDCommand: `autoconfig crd` prints exactly the committed
// deploy/crds file; stray arguments are a usage error.
func TestCRDCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"crd"}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	committed, err := os.ReadFile(filepath.Join("..", "..", "deploy", "crds", crdgen.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), committed) {
		t.Errorf("autoconfig crd differs from deploy/crds/%s; regenerate it with go generate ./internal/crdgen", crdgen.FileName)
	}

	out.Reset()
	errb.Reset()
	if code := Main([]string{"crd", "extra"}, nil, &out, &errb); code != 2 {
		t.Errorf("crd extra: exit %d, want 2", code)
	}
	if !strings.Contains(errb.String(), "Usage: autoconfig crd") {
		t.Errorf("crd extra: no usage on stderr: %q", errb.String())
	}
	if code := Main([]string{"crd", "--help"}, nil, &out, &errb); code != 0 {
		t.Errorf("crd --help: exit %d, want 0", code)
	}
}
