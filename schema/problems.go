package schema

// This file: every problem of a document in one run, each at its line and
// column. check validates, sets the problems found aside (repair) and
// validates again, because CUE reports some problems only when others are
// gone.

import (
	"fmt"
	"regexp"
	"regexp/syntax"
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

// msgRequired is the message of a missing required field.
const msgRequired = "this field is required; add it"

// maxPasses bounds the re-validations that look for problems hidden by
// the ones already found (each pass costs one CUE evaluation).
const maxPasses = 8

// check unifies data-first (so error paths read spec.…), validates concrete
// and decodes into the Go types. An invalid document is validated again
// after each pass's problems are set aside (repair), because CUE hides some
// problems behind others: a required field's absence and an unknown field
// are reported only when nothing else is wrong, and a rule failing on a
// struct hides everything below it. So one run reports every problem of the
// document. docPos is the document's start; with located, positions come
// from expr (the input's own syntax tree). The caller holds v.mu; expr is
// modified.
func (v *Validator) check(filename string, docPos token.Pos, expr ast.Expr, located bool) (*v1alpha1.ModelRoute, error) {
	u := v.ctx.BuildExpr(expr).Unify(v.def)
	err := u.Validate(cue.Concrete(true), cue.Final())
	if err == nil {
		var r v1alpha1.ModelRoute
		if err := u.Decode(&r); err != nil {
			return nil, fmt.Errorf("%s:%d: decode route: %w", filename, docPos.Line(), err)
		}
		return &r, nil
	}
	var loc ast.Expr
	if located {
		loc = expr
	}
	// Each pass validates twice: concrete, and without the concreteness
	// check, which still reports unknown fields and bad values while a
	// missing required field (which repair cannot supply) is reported.
	find := func(err error) []problem {
		ps := problems(filename, docPos, loc, expr, err)
		if err := v.ctx.BuildExpr(expr).Unify(v.def).Validate(cue.Final()); err != nil {
			for _, p := range problems(filename, docPos, loc, expr, err) {
				// Only what is wrong whatever is added: a value not yet
				// concrete is the concrete pass's business.
				if !p.incomplete && !slices.ContainsFunc(ps, p.related) {
					ps = append(ps, p)
				}
			}
		}
		return ps
	}
	all := find(err)
	fresh := all
	for pass := 1; pass < maxPasses && v.repair(expr, fresh); pass++ {
		err := v.ctx.BuildExpr(expr).Unify(v.def).Validate(cue.Concrete(true), cue.Final())
		if err == nil {
			break
		}
		fresh = nil
		for _, p := range find(err) {
			// A value left open by a removal (a peer without use leaves
			// the rules on use unresolved) is the repair's doing; a
			// required field that is missing is news.
			if p.incomplete && p.Message != msgRequired {
				continue
			}
			if !slices.ContainsFunc(all, p.related) {
				all = append(all, p)
				fresh = append(fresh, p)
			}
		}
	}
	sort.SliceStable(all, func(i, j int) bool {
		if all[i].Line != all[j].Line {
			return all[i].Line < all[j].Line
		}
		if all[i].Column != all[j].Column {
			return all[i].Column < all[j].Column
		}
		return all[i].Path < all[j].Path
	})
	out := make([]Problem, len(all))
	for i, p := range all {
		out[i] = p.Problem
	}
	return nil, &InvalidError{Problems: out}
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

// problem is a Problem with what repair needs.
type problem struct {
	Problem
	comps []string // the field path, one element per label or index
	// fix: how repair sets the problem aside (fixNone: it cannot).
	fix fixKind
	// incomplete: CUE's complaint about a value not concrete (yet).
	incomplete bool
}

type fixKind int

const (
	fixNone    fixKind = iota
	fixDelete          // remove the field (or empty the list element)
	fixValidID         // replace the value with a valid name
)

// related reports whether q is p, or above or below it: a problem repair
// brought to light there is a consequence of the repair, not news.
func (p problem) related(q problem) bool {
	a, b := p.Path, q.Path
	return a == b || strings.HasPrefix(a, b+".") || strings.HasPrefix(b, a+".")
}

// fieldRef is a field named at the start of a rule's message
// ("monitor.outputConfigMap is …", "spec.slo.ttftMs and …").
var fieldRef = regexp.MustCompile(`^(?:spec\.|metadata\.)?[a-z][A-Za-z]*\.[a-z][A-Za-z]*(?:\.[a-z][A-Za-z]*)*\b`)

// problems turns CUE errors into located, deduplicated problems. root is
// the document's syntax tree when positions come from it (nil: the first
// position CUE gives inside the file, else the document's line); tree is
// the tree repair works on.
func problems(filename string, docPos token.Pos, root, tree ast.Expr, err error) []problem {
	seen := map[string]bool{}
	var out []problem
	for _, e := range cueerrors.Errors(err) {
		format, args := e.Msg()
		msg := fmt.Sprintf(format, args...)
		if strings.HasSuffix(msg, "errors in empty disjunction:") {
			// A summary line; the disjuncts' own errors follow it.
			continue
		}
		incomplete := strings.HasPrefix(msg, "incomplete value") || strings.HasPrefix(msg, "unresolved disjunction") ||
			strings.HasPrefix(msg, "non-concrete value") || strings.HasPrefix(msg, "required field missing")
		comps := slices.Clone(e.Path())
		missing, unknown := false, strings.HasPrefix(msg, "field not allowed")
		if f, ok := strings.CutPrefix(msg, "required field missing: "); ok {
			// CUE names the missing field in the message, not the path.
			comps = append(comps, f)
			msg = "field is required but not present"
			missing = true
		}
		// Two failures CUE reports without a useful path: a missing
		// metadata.name (seen through the rule guard _named) and a peer
		// without use (seen through the rules comparing it).
		switch {
		case len(comps) == 1 && comps[0] == "_named":
			comps, msg, missing = []string{"metadata", "name"}, "field is required but not present", true
		case strings.Contains(msg, `non-concrete value =~"^(cart|backend|backend-svc)$"`):
			comps, msg = []string{"spec", "nginx", "peers"}, "every peer needs use: cart, backend or backend-svc; add it"
		case len(comps) <= 1:
			// A rule on the document or on spec fails the whole struct;
			// its message names the field it is about.
			if ref := fieldRef.FindString(msg); ref != "" {
				c := strings.Split(ref, ".")
				if c[0] != "spec" && c[0] != "metadata" {
					c = append([]string{"spec"}, c...)
				}
				if _, _, ok := lookup(tree, c); ok {
					comps = c
				}
			}
		}
		p := problem{Problem: Problem{File: filename, Path: strings.Join(comps, "."), Message: humanize(msg)}, comps: comps, incomplete: incomplete}
		p.Line, p.Column = docPos.Line(), docPos.Column()
		field, val, found := lookup(tree, comps)
		switch {
		case missing:
		case root != nil && found:
			// The value for a bad value; the key for an unknown field
			// and for a rule on a whole struct or list.
			pos := token.NoPos
			if val != nil && !unknown && (field == nil || !isComposite(val)) {
				pos = val.Pos()
			}
			if !pos.IsValid() && field != nil {
				pos = field.Label.Pos()
			}
			if pos.IsValid() {
				p.Line, p.Column = pos.Line(), pos.Column()
			}
		default:
			for _, pos := range append([]token.Pos{e.Position()}, e.InputPositions()...) {
				if pos.IsValid() && pos.Filename() == filename {
					p.Line, p.Column = pos.Line(), 0
					break
				}
			}
		}
		if root == nil {
			p.Column = 0
		}
		switch {
		case !found || missing:
		case unknown:
			p.fix = fixDelete
		case p.Path == "metadata.name":
			p.fix = fixValidID
		case !isComposite(val):
			p.fix = fixDelete
		}
		if k := p.String(); !seen[k] {
			seen[k] = true
			out = append(out, p)
		}
	}
	return out
}

// isComposite reports a struct or list value (a rule about it is not set
// aside by removing it: that would hide what is inside).
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
			for _, d := range n.Elts {
				f, ok := d.(*ast.Field)
				if !ok {
					continue
				}
				if l, _, _ := ast.LabelName(f.Label); l == c {
					field = f
					break
				}
			}
			if field == nil {
				return nil, nil, false
			}
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

// repair sets the problems aside in expr: an unknown field is removed, a
// bad metadata.name becomes a valid name, and a bad scalar is replaced by
// the first value the schema accepts there (its default, an allowed
// literal, a value of its kind) or, failing that, removed (a list element
// becomes {}). Removing a required value would itself be a problem that
// hides others (a peer without use fails the rules on all peers). It
// reports whether it changed anything. The caller holds v.mu.
func (v *Validator) repair(expr ast.Expr, ps []problem) bool {
	changed := false
	for _, p := range ps {
		if p.fix == fixNone {
			continue
		}
		container := expr
		if len(p.comps) > 1 {
			_, c, ok := lookup(expr, p.comps[:len(p.comps)-1])
			if !ok {
				continue
			}
			container = c
		}
		last := p.comps[len(p.comps)-1]
		switch n := container.(type) {
		case *ast.StructLit:
			for i, d := range n.Elts {
				f, ok := d.(*ast.Field)
				if !ok {
					continue
				}
				if l, _, _ := ast.LabelName(f.Label); l != last {
					continue
				}
				switch {
				case p.fix == fixValidID:
					f.Value = ast.NewString("name")
				case p.fix == fixDelete && !strings.HasPrefix(p.Message, "unknown field"):
					if v.replace(expr, p, func(x ast.Expr) { f.Value = x }) {
						break
					}
					fallthrough
				default:
					n.Elts = slices.Delete(n.Elts, i, i+1)
				}
				changed = true
				break
			}
		case *ast.ListLit:
			if i, err := strconv.Atoi(last); err == nil && i >= 0 && i < len(n.Elts) {
				if !v.replace(expr, p, func(x ast.Expr) { n.Elts[i] = x }) {
					n.Elts[i] = &ast.StructLit{}
				}
				changed = true
			}
		}
	}
	return changed
}

// replace tries the candidate values for p's field (set puts one in
// place) and keeps the first with which the document has no problem at,
// above or below p. It reports whether one was kept.
func (v *Validator) replace(expr ast.Expr, p problem, set func(ast.Expr)) bool {
	for _, c := range v.candidates(p.comps) {
		set(c)
		err := v.ctx.BuildExpr(expr).Unify(v.def).Validate(cue.Final())
		if err == nil || !slices.ContainsFunc(problems(p.File, token.NoPos, nil, expr, err), p.related) {
			return true
		}
	}
	return false
}

// candidates are values the schema may accept at comps: its default, the
// literals of a disjunction or of a regex such as ^(a|b|c)$, then one
// value of each kind it allows.
func (v *Validator) candidates(comps []string) []ast.Expr {
	sels := make([]cue.Selector, len(comps))
	for i, c := range comps {
		sels[i] = cue.Str(c)
		if _, err := strconv.Atoi(c); err == nil {
			sels[i] = cue.AnyIndex
		}
	}
	at := v.def.LookupPath(cue.MakePath(sels...))
	if !at.Exists() {
		return nil
	}
	var out []ast.Expr
	add := func(x cue.Value) {
		if x.IsConcrete() {
			if e, ok := x.Syntax(cue.Final()).(ast.Expr); ok {
				out = append(out, e)
			}
		}
	}
	if d, ok := at.Default(); ok {
		add(d)
	}
	var walk func(x cue.Value, depth int)
	walk = func(x cue.Value, depth int) {
		if depth > 4 {
			return
		}
		op, args := x.Expr()
		switch op {
		case cue.OrOp, cue.AndOp:
			for _, a := range args {
				walk(a, depth+1)
			}
		case cue.RegexMatchOp:
			if len(args) == 1 {
				if re, err := args[0].String(); err == nil {
					for _, lit := range regexLiterals(re) {
						out = append(out, ast.NewString(lit))
					}
				}
			}
		case cue.NoOp:
			add(x)
		}
	}
	walk(at, 0)
	k := at.IncompleteKind()
	if k&cue.IntKind != 0 {
		out = append(out, ast.NewLit(token.INT, "1"))
	}
	if k&cue.StringKind != 0 {
		out = append(out, ast.NewString("x"))
	}
	if k&cue.BoolKind != 0 {
		out = append(out, ast.NewBool(false))
	}
	return out
}

// regexLiterals are the alternatives of a regex that only matches a few
// literals (^(cart|backend|backend-svc)$); nil for any other.
func regexLiterals(re string) []string {
	r, err := syntax.Parse(re, syntax.Perl)
	if err != nil {
		return nil
	}
	r = r.Simplify()
	var lits []string
	var walk func(r *syntax.Regexp) bool
	walk = func(r *syntax.Regexp) bool {
		switch r.Op {
		case syntax.OpConcat:
			var b strings.Builder
			for _, s := range r.Sub {
				switch s.Op {
				case syntax.OpBeginText, syntax.OpEndText, syntax.OpBeginLine, syntax.OpEndLine:
				case syntax.OpLiteral:
					b.WriteString(string(s.Rune))
				case syntax.OpCapture, syntax.OpAlternate:
					if b.Len() > 0 || !walk(s) {
						return false
					}
				default:
					return false
				}
			}
			if b.Len() > 0 {
				lits = append(lits, b.String())
			}
			return true
		case syntax.OpCapture:
			return walk(r.Sub[0])
		case syntax.OpAlternate:
			for _, s := range r.Sub {
				if !walk(s) {
					return false
				}
			}
			return true
		case syntax.OpLiteral:
			lits = append(lits, string(r.Rune))
			return true
		case syntax.OpCharClass:
			// a prefix factored out by Simplify (backend|backend-svc):
			return false
		}
		return false
	}
	if !walk(r) {
		return nil
	}
	return lits
}
