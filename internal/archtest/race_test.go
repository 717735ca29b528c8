package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/modelsphere/autoconfig/internal/testbin"
)

// racePkgs reads the package patterns of make test's race run
// (RACE_PKGS in the Makefile).
func racePkgs(t *testing.T, root string) []string {
	t.Helper()
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^RACE_PKGS\s*:?=\s*(.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile has no RACE_PKGS line")
	}
	return strings.Fields(string(m[1]))
}

// covered reports whether dir (relative, slash-separated) matches one of
// the go test patterns ("./x/..." or "./x").
func covered(dir string, patterns []string) bool {
	for _, p := range patterns {
		p = strings.TrimPrefix(p, "./")
		if rest, ok := strings.CutSuffix(p, "..."); ok {
			rest = strings.TrimSuffix(rest, "/")
			if rest == "" || dir == rest || strings.HasPrefix(dir, rest+"/") {
				return true
			}
		} else if dir == p {
			return true
		}
	}
	return false
}

// TestRaceRunCoversGoroutines: every package whose code or tests start a
// goroutine (a go statement), or that the controller calls from several
// workers (the sink), is in make test's race run, so a data race in it can
// fail CI.
func TestRaceRunCoversGoroutines(t *testing.T) {
	root := testbin.Root(t)
	patterns := racePkgs(t, root)
	concurrent := map[string]bool{"internal/sink": true} // called by concurrent reconcile workers
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if _, ok := n.(*ast.GoStmt); ok {
				rel, _ := filepath.Rel(root, filepath.Dir(p))
				concurrent[filepath.ToSlash(rel)] = true
				return false
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"internal/readiness", "internal/informer"} {
		if !concurrent[dir] {
			t.Fatalf("no go statement found in %s: the scan is broken", dir)
		}
	}
	var missing []string
	for dir := range concurrent {
		if !covered(dir, patterns) {
			missing = append(missing, dir)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("packages with goroutines missing from RACE_PKGS in the Makefile: %v", missing)
	}
}
