package schema

// This file: every problem of a document from one evaluation, each at its
// line and column. The schema is written so that one CUE evaluation
// reports them all (modelroute.cue, package comment): a rule on a field's
// value fails on the field, an unknown field fails on itself, and a rule
// across fields records its message under the hidden field _rule at the
// path of the field it names. Here the errors are only located.

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"cuelang.org/go/cue"
	"cuelang.org/go/cue/ast"
	cueerrors "cuelang.org/go/cue/errors"
	"cuelang.org/go/cue/token"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// msgRequired words CUE's complaint about a value that is not concrete: a
// required field the document lacks. The schema reports missing fields
// itself once the document holds a route; CUE's complaint remains for a
// document with (nearly) nothing in it.
const msgRequired = "this field is required; add it"

// check unifies data-first (so error paths read spec.…), validates concrete
// and decodes into the Go types. docPos is the document's start; with
// located, positions come from expr (the input's own syntax tree). The
// caller holds v.mu.
func (v *Validator) check(filename string, docPos token.Pos, expr ast.Expr, located bool) (*v1alpha1.ModelRoute, error) {
	u := v.ctx.BuildExpr(expr).Unify(v.def)
	err := u.Validate(cue.Concrete(true), cue.Final())
	if err == nil {
		r, err := decode(u)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: decode route: %w", filename, docPos.Line(), err)
		}
		return r, nil
	}
	var tree ast.Expr
	if located {
		tree = expr
	}
	return nil, &InvalidError{Problems: v.problems(u, filename, docPos, expr, tree, err)}
}

// decode decodes a valid route part by part: decoding the whole value
// would first order the fields of its root, which holds every rule of the
// schema.
func decode(u cue.Value) (*v1alpha1.ModelRoute, error) {
	var r v1alpha1.ModelRoute
	parts := []struct {
		name string
		dst  any
	}{{"apiVersion", &r.APIVersion}, {"kind", &r.Kind}, {"metadata", &r.ObjectMeta}, {"spec", &r.Spec}, {"status", &r.Status}}
	for _, p := range parts {
		x := u.LookupPath(cue.MakePath(cue.Str(p.name)))
		if !x.Exists() {
			continue
		}
		if err := x.Decode(p.dst); err != nil {
			return nil, err
		}
	}
	return &r, nil
}

// lineOnly is the position of a line of a file whose syntax tree does not
// hold the input's positions (a route read through JSON).
func lineOnly(filename string, line int) token.Pos {
	f := token.NewFile(filename, 0, line+1)
	lines := make([]int, line)
	for i := range lines {
		lines[i] = i
	}
	f.SetLines(lines)
	return f.Pos(line-1, token.NoRelPos)
}

// problems turns the errors of one validation of u (expr unified with the
// definition) into located, deduplicated problems, sorted by position. tree
// is expr when positions come from it (nil: the document's line).
func (v *Validator) problems(u cue.Value, filename string, docPos token.Pos, expr, tree ast.Expr, err error) []Problem {
	seen := map[string]bool{}
	var out []Problem
	for _, e := range cueerrors.Errors(err) {
		format, args := e.Msg()
		msg := fmt.Sprintf(format, args...)
		comps, hidden := dataPath(e.Path())
		switch {
		case hidden:
		case missing(u, comps):
			msg = msgRequired
		default:
			if m := v.wrongKind(expr, comps); m != "" {
				msg = m
			}
		}
		p := Problem{File: filename, Path: strings.Join(comps, "."), Message: msg}
		p.Line, p.Column = docPos.Line(), docPos.Column()
		if tree != nil {
			if pos := v.position(tree, comps); pos.IsValid() {
				p.Line, p.Column = pos.Line(), pos.Column()
			}
		} else {
			p.Column = 0
		}
		if k := p.String(); !seen[k] {
			seen[k] = true
			out = append(out, p)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Line != out[j].Line {
			return out[i].Line < out[j].Line
		}
		if out[i].Column != out[j].Column {
			return out[i].Column < out[j].Column
		}
		return out[i].Path < out[j].Path
	})
	return out
}

// dataPath is the document path an error is about: its path without the
// hidden fields (a rule across fields records its message under one, at
// the path of the field it names), with quoted labels unquoted. hidden
// reports that the path went through a hidden field.
func dataPath(path []string) (comps []string, hidden bool) {
	for _, c := range path {
		switch {
		case strings.HasPrefix(c, "_"):
			hidden = true
		case strings.HasPrefix(c, `"`):
			if s, err := strconv.Unquote(c); err == nil {
				c = s
			}
			comps = append(comps, c)
		default:
			comps = append(comps, c)
		}
	}
	return comps, hidden
}

// selectors turns a document path into CUE selectors; optional marks
// every label optional (to look through the optional fields of the bare
// definition) and indices become "any element".
func selectors(comps []string, optional bool) []cue.Selector {
	sels := make([]cue.Selector, len(comps))
	for i, c := range comps {
		if n, err := strconv.Atoi(c); err == nil && n >= 0 {
			sels[i] = cue.Index(n)
			if optional {
				sels[i] = cue.AnyIndex
			}
			continue
		}
		sels[i] = cue.Str(c)
		if optional {
			sels[i] = sels[i].Optional()
		}
	}
	return sels
}

// missing reports a value at comps that is there but not concrete: CUE's
// "incomplete value", a required field the document lacks.
func missing(u cue.Value, comps []string) bool {
	x := u.LookupPath(cue.MakePath(selectors(comps, false)...))
	return x.Exists() && x.Err() == nil && !x.IsConcrete()
}

// wrongKind words the error of a struct or list given as another kind of
// value: CUE's own message quotes the whole schema of the struct. The
// schema words every other kind of mistake itself ("" for those).
func (v *Validator) wrongKind(expr ast.Expr, comps []string) string {
	if len(comps) == 0 {
		return ""
	}
	var want string
	switch v.def.LookupPath(cue.MakePath(selectors(comps, true)...)).IncompleteKind() {
	case cue.StructKind:
		want = "a mapping of fields"
	case cue.ListKind:
		want = "a list"
	default:
		return ""
	}
	_, val, found := lookup(expr, comps)
	if !found {
		return ""
	}
	var got string
	switch x := val.(type) {
	case *ast.StructLit:
		got = "a mapping"
	case *ast.ListLit:
		got = "a list"
	case *ast.BasicLit:
		got = map[token.Token]string{token.STRING: "a string", token.INT: "a number", token.FLOAT: "a number",
			token.TRUE: "true", token.FALSE: "false", token.NULL: "empty (null)"}[x.Kind]
	}
	if got == "" || strings.HasPrefix(want, got) {
		return ""
	}
	return fmt.Sprintf("must be %s, not %s; see the ModelRoute reference for its fields", want, got)
}

// admits reports a field the schema admits: one it declares, or a key of
// a map such as nginx.values (not an unknown field or a key of a wrong
// form, which the schema admits only to reject).
func (v *Validator) admits(comps []string) bool {
	x := v.def.LookupPath(cue.MakePath(selectors(comps, true)...))
	return len(comps) > 0 && x.Exists() && x.Err() == nil
}

// position locates comps in the document: the value of a bad value of a
// field the schema admits, otherwise the key (an unknown field, a key of a
// wrong form, a struct or list); for a field the document lacks, the key of
// its nearest ancestor in the document (where to add it), or nothing.
func (v *Validator) position(tree ast.Expr, comps []string) token.Pos {
	for n := len(comps); n > 0; n-- {
		field, val, found := lookup(tree, comps[:n])
		if !found {
			continue
		}
		if n == len(comps) && val != nil && !isComposite(val) && (field == nil || v.admits(comps)) {
			if pos := val.Pos(); pos.IsValid() {
				return pos
			}
		}
		if field != nil {
			return field.Label.Pos()
		}
		if val != nil {
			return val.Pos()
		}
	}
	return token.NoPos
}

// isComposite reports a struct or list value.
func isComposite(x ast.Expr) bool {
	switch x.(type) {
	case *ast.StructLit, *ast.ListLit:
		return true
	}
	return false
}

// lookup finds the node at comps: the field holding it (nil for a list
// element) and its value.
func lookup(expr ast.Expr, comps []string) (*ast.Field, ast.Expr, bool) {
	cur := expr
	var field *ast.Field
	for _, c := range comps {
		field = nil
		switch n := cur.(type) {
		case *ast.StructLit:
			i := slices.IndexFunc(n.Elts, func(d ast.Decl) bool {
				f, ok := d.(*ast.Field)
				if !ok {
					return false
				}
				l, _, _ := ast.LabelName(f.Label)
				return l == c
			})
			if i < 0 {
				return nil, nil, false
			}
			field = n.Elts[i].(*ast.Field)
			cur = field.Value
		case *ast.ListLit:
			i, err := strconv.Atoi(c)
			if err != nil || i < 0 || i >= len(n.Elts) {
				return nil, nil, false
			}
			cur = n.Elts[i]
		default:
			return nil, nil, false
		}
	}
	return field, cur, len(comps) > 0
}
