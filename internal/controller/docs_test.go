package controller

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestDocsListEveryReason: every condition reason the controller sets (a
// Reason* constant in this package) is in docs/controller.md's tables.
func TestDocsListEveryReason(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "controller.md"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files, _ := filepath.Glob("*.go")
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(node ast.Node) bool {
			vs, ok := node.(*ast.ValueSpec)
			if !ok || len(vs.Names) != 1 || !strings.HasPrefix(vs.Names[0].Name, "Reason") || len(vs.Values) != 1 {
				return true
			}
			lit, ok := vs.Values[0].(*ast.BasicLit)
			if !ok {
				return true
			}
			v, _ := strconv.Unquote(lit.Value)
			n++
			if !strings.Contains(string(doc), "`"+v+"`") {
				t.Errorf("%s (%s, %s) is not in docs/controller.md", vs.Names[0].Name, v, f)
			}
			return true
		})
	}
	if n < 15 {
		t.Fatalf("found %d reasons; the parser missed them", n)
	}
}
