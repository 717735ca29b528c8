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
				if it.Value().Err() == nil {
					continue
				}
				op, args := sel.Pattern().Expr()
				if op != cue.NotRegexMatchOp {
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
// accepts) are the fields of #VideoValues; the keys #Nginx leaves to #Spec
// (a form of their own) are those and shared_dict_size; and an LLM route
// takes each video key as a plain value.
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
	root := cuecontext.New().CompileBytes(src)
	fieldsOf := func(v cue.Value) []string {
		it, err := v.Fields(cue.Optional(true))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for it.Next() {
			out = append(out, it.Selector().Unquoted())
		}
		sort.Strings(out)
		return out
	}
	keys := fieldsOf(root.LookupPath(cue.ParsePath("#VideoValues")))
	if got := altsOf(t, strs["_videoKeys"]); !slices.Equal(got, keys) {
		t.Errorf("_videoKeys lists %v; #VideoValues has %v", got, keys)
	}
	if !regexp.MustCompile(strs["_videoKeys"]).MatchString("rate_limit") {
		t.Error("_videoKeys does not match rate_limit")
	}
	own := append(slices.Clone(keys), "shared_dict_size")
	sort.Strings(own)
	// #Nginx: [=~keyRE & !="a" & !="b" …]: #Value.
	it, err := root.LookupPath(cue.MakePath(cue.Def("#Nginx"), cue.Str("values").Optional())).Fields(cue.Optional(true), cue.Patterns(true))
	if err != nil {
		t.Fatal(err)
	}
	var excluded []string
	for it.Next() {
		if it.Selector().ConstraintType() != cue.PatternConstraint {
			continue
		}
		if it.Value().Err() == nil {
			excluded = append(excluded, notEqualNamesIn(it.Selector().Pattern())...)
		}
	}
	sort.Strings(excluded)
	if !slices.Equal(excluded, own) {
		t.Errorf("#Nginx.values leaves %v to #Spec; want %v", excluded, own)
	}
	// An LLM route (the default model type) takes the video keys.
	llm := fieldsOf(root.LookupPath(cue.ParsePath("#Spec.nginx.values")))
	if !slices.Equal(llm, own) {
		t.Errorf("#Spec (llm) declares values %v; want %v", llm, own)
	}
}

// notEqualNamesIn returns the != strings of a conjunction (=~re & !="a" …).
func notEqualNamesIn(v cue.Value) []string {
	switch op, args := v.Expr(); op {
	case cue.AndOp:
		var out []string
		for _, a := range args {
			out = append(out, notEqualNamesIn(a)...)
		}
		return out
	case cue.NotEqualOp:
		s, _ := args[0].String()
		return []string{s}
	}
	return nil
}
