package schema_test

import (
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"cuelang.org/go/cue"
	"cuelang.org/go/cue/ast"
	"cuelang.org/go/cue/cuecontext"
	"cuelang.org/go/cue/literal"
	"cuelang.org/go/cue/parser"

	"github.com/modelsphere/autoconfig/schema"
)

// altsOf returns the alternatives of a regex ^(a|b|c)$ listing names.
func altsOf(t *testing.T, re string) []string {
	t.Helper()
	inner, ok := strings.CutPrefix(re, "^(")
	if inner, ok = strings.CutSuffix(inner, ")$"); !ok || strings.ContainsAny(inner, `()[]\*+?.^$`) {
		t.Fatalf("%q does not list names as ^(a|b|…)$", re)
	}
	alts := strings.Split(inner, "|")
	sort.Strings(alts)
	return alts
}

// TestUnknownFieldPatternsListTheFields: the `[!~"^(…)$"]: unknownField`
// pattern of every closed struct of the schema names exactly the struct's
// fields. A field missing from it would be reported as unknown; a name
// that is not a field would leave an unknown field to CUE's closedness
// check, which CUE skips in a struct that holds another error.
func TestUnknownFieldPatternsListTheFields(t *testing.T) {
	src, err := schema.FS.ReadFile(schema.SchemaFile)
	if err != nil {
		t.Fatal(err)
	}
	root := cuecontext.New().CompileBytes(src)
	checked := 0
	var walk func(v cue.Value, path string)
	walk = func(v cue.Value, path string) {
		it, err := v.Fields(cue.Optional(true), cue.Definitions(true), cue.Patterns(true))
		if err != nil {
			return
		}
		var fields, listed []string
		for it.Next() {
			sel := it.Selector()
			switch {
			case sel.ConstraintType() == cue.PatternConstraint:
				op, args := sel.Pattern().Expr()
				if op != cue.NotRegexMatchOp || it.Value().Err() == nil {
					continue
				}
				re, _ := args[0].String()
				if alts := strings.TrimPrefix(re, "^("); alts != re && !strings.ContainsAny(strings.TrimSuffix(alts, ")$"), "[]\\*+?") {
					listed = altsOf(t, re)
				}
			case sel.IsDefinition():
				walk(it.Value(), path+sel.String())
			case sel.LabelType() == cue.StringLabel:
				fields = append(fields, sel.Unquoted())
				walk(it.Value(), path+"."+sel.Unquoted())
			}
		}
		if listed == nil {
			return
		}
		sort.Strings(fields)
		if !slices.Equal(fields, listed) {
			t.Errorf("%s: fields %v, unknown-field pattern lists %v", path, fields, listed)
		}
		checked++
	}
	walk(root, "")
	if checked < 9 {
		t.Errorf("checked %d unknown-field patterns, want every closed struct (at least 9)", checked)
	}
}

// TestVideoKeyListsFollowVideoValues: _videoKeys (the keys a video route
// accepts) are the fields of #VideoValues, and _ownForm (the keys whose
// rule comes from #Spec) those and shared_dict_size.
func TestVideoKeyListsFollowVideoValues(t *testing.T) {
	src, err := schema.FS.ReadFile(schema.SchemaFile)
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(schema.SchemaFile, src)
	if err != nil {
		t.Fatal(err)
	}
	strs := map[string]string{}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.Field)
		if !ok {
			continue
		}
		name, _, _ := ast.LabelName(fd.Label)
		if lit, ok := fd.Value.(*ast.BasicLit); ok {
			strs[name], _ = literal.Unquote(lit.Value)
		}
	}
	vv := cuecontext.New().CompileBytes(src).LookupPath(cue.ParsePath("#VideoValues"))
	it, err := vv.Fields(cue.Optional(true))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for it.Next() {
		keys = append(keys, it.Selector().Unquoted())
	}
	sort.Strings(keys)
	if got := altsOf(t, strs["_videoKeys"]); !slices.Equal(got, keys) {
		t.Errorf("_videoKeys lists %v; #VideoValues has %v", got, keys)
	}
	own := append(slices.Clone(keys), "shared_dict_size")
	sort.Strings(own)
	if got := altsOf(t, strs["_ownForm"]); !slices.Equal(got, own) {
		t.Errorf("_ownForm lists %v; want %v", got, own)
	}
	if !regexp.MustCompile(strs["_videoKeys"]).MatchString("rate_limit") {
		t.Error("_videoKeys does not match rate_limit")
	}
}
