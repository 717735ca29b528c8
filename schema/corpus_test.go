package schema_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelsphere/autoconfig/schema"
)

// corpusDir is the shared validation corpus (also judged by cue vet and the
// CRD).
const corpusDir = "../testdata/routes"

// wantOf reads the "# want: …" line an invalid corpus file starts with.
func wantOf(t *testing.T, src []byte) string {
	t.Helper()
	for _, l := range strings.Split(string(src), "\n") {
		if w, ok := strings.CutPrefix(l, "# want: "); ok {
			return w
		}
	}
	t.Fatal("invalid corpus file has no '# want: ' line")
	return ""
}

func TestCorpusValid(t *testing.T) {
	v := mustValidator(t)
	files := glob(t, filepath.Join(corpusDir, "valid", "*.yaml"))
	files = append(files, glob(t, "../deploy/samples/*.yaml")...)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			r, err := v.Validate(f, src)
			if err != nil {
				t.Fatalf("valid route rejected:\n%v", err)
			}
			if r.Spec.Nginx.Route == "" || r.Spec.ModelType == "" {
				t.Errorf("defaults not filled: route %q modelType %q", r.Spec.Nginx.Route, r.Spec.ModelType)
			}
		})
	}
}

func TestCorpusInvalid(t *testing.T) {
	v := mustValidator(t)
	files := glob(t, filepath.Join(corpusDir, "invalid", "*.yaml"))
	if len(files) < 60 {
		t.Fatalf("invalid corpus has %d files, want at least 60", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			want := wantOf(t, src)
			_, err = v.Validate(f, src)
			var inv *schema.InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("want rejection %q, got %v", want, err)
			}
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("want message containing %q, got:\n%v", want, err)
			}
			for _, p := range inv.Problems {
				if p.Line < 1 || p.File != f {
					t.Errorf("problem not located in the input: %+v", p)
				}
			}
		})
	}
}

func mustValidator(t testing.TB) *schema.Validator {
	t.Helper()
	v, err := schema.Default()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func glob(t *testing.T, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(pattern)
	if err != nil || len(m) == 0 {
		t.Fatalf("no files match %s (%v)", pattern, err)
	}
	return m
}
