package crdgen

import (
	"fmt"
	"regexp"
	"regexp/syntax"
	"sort"
	"strconv"
	"strings"

	"cuelang.org/go/cue"
	"cuelang.org/go/cue/ast"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// walker turns compiled CUE definitions into OpenAPI v3 schemas. It reads
// each field's constraint tree with cue.Value.Expr: `=~` is a pattern,
// `>=`/`<=` bounds, strings.MaxRunes maxLength, a disjunction of concrete
// values an enum, `[string]: T` a map, `[K=!~re]: error(…)` a key rule. A
// field's error() message goes into its description and, where the check
// can be a cheap CEL rule (bounded patterns, bounds, enums), becomes that
// rule's message, so the API server words it as CUE does. Struct fields
// that reference a definition are walked
// from the clean definition, not from the evaluated parent: an evaluated
// #Spec already carries the default-triggered llm branch (e.g. "use:
// backend | backend-svc"), which is a cross-field rule, not a field type.
type walker struct {
	root cue.Value
	// notRequired lists regular fields (dotted path, [] for list items)
	// that CUE fills through a conditional default the walker cannot see
	// as Default(), so they must not be required in the CRD.
	notRequired map[string]bool
	// required lists regular fields CUE gives an implicit default that
	// a rule then rejects (an absent [...] list is [], and "needs at least
	// one" fires), so absent must be rejected in the CRD too.
	required map[string]bool
}

// scalar accumulates the constraints of one leaf.
type scalar struct {
	kind     cue.Kind
	enum     []any
	patterns []string
	min, max *int64
	maxLen   *int64
	messages []string
}

const maxDepth = 64

func (w *walker) collect(v cue.Value, s *scalar, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("constraint too deep: %v", v)
	}
	op, args := v.Expr()
	switch op {
	case cue.AndOp:
		for _, a := range args {
			if err := w.collect(a, s, depth+1); err != nil {
				return err
			}
		}
	case cue.OrOp:
		var concrete, open []cue.Value
		for _, a := range args {
			switch {
			case a.Err() != nil:
				s.messages = append(s.messages, errorText(a))
			case a.IncompleteKind() == cue.TopKind:
				// `*default | _`: the disjunction adds no constraint.
				return nil
			case a.IsConcrete():
				concrete = append(concrete, a)
			default:
				open = append(open, a)
			}
		}
		switch {
		case len(open) == 0:
			for _, c := range concrete {
				var x any
				if err := c.Decode(&x); err != nil {
					return fmt.Errorf("decode enum value %v: %w", c, err)
				}
				s.enum = append(s.enum, x)
			}
		case len(open) == 1:
			// Concrete alternatives beside an open one are its defaults
			// (`*"64m" | #NginxSize`): they satisfy it anyway.
			return w.collect(open[0], s, depth+1)
		default:
			return fmt.Errorf("disjunction of %d open constraints is not expressible as OpenAPI: %v", len(open), v)
		}
	case cue.RegexMatchOp:
		re, err := args[0].String()
		if err != nil {
			return fmt.Errorf("regex %v: %w", v, err)
		}
		s.patterns = append(s.patterns, re)
	case cue.GreaterThanEqualOp, cue.LessThanEqualOp:
		n, err := args[0].Int64()
		if err != nil {
			return fmt.Errorf("bound %v: %w", v, err)
		}
		if op == cue.GreaterThanEqualOp {
			s.min = maxPtr(s.min, n)
		} else {
			s.max = minPtr(s.max, n)
		}
	case cue.CallOp:
		if fn := fmt.Sprint(args[0]); len(args) == 2 && strings.HasSuffix(fn, "MaxRunes") {
			n, err := args[1].Int64()
			if err != nil {
				return fmt.Errorf("MaxRunes %v: %w", v, err)
			}
			s.maxLen = minPtr(s.maxLen, n)
			return nil
		}
		return fmt.Errorf("unsupported call %v", v)
	case cue.SelectorOp:
		d := cue.Dereference(v)
		if dop, _ := d.Expr(); dop == cue.SelectorOp {
			return fmt.Errorf("cannot resolve reference %v", v)
		}
		return w.collect(d, s, depth+1)
	case cue.NoOp:
		k := v.IncompleteKind()
		switch {
		case k == cue.TopKind:
		case v.IsConcrete():
			var x any
			if err := v.Decode(&x); err != nil {
				return fmt.Errorf("decode %v: %w", v, err)
			}
			s.enum = append(s.enum, x)
		default:
			s.kind = k
		}
	default:
		return fmt.Errorf("unsupported constraint %v (op %v)", v, op)
	}
	return nil
}

// errorText is the message of an error("…") disjunct.
func errorText(v cue.Value) string {
	_, args := v.Expr()
	if len(args) == 2 {
		if s, err := args[1].String(); err == nil {
			return s
		}
	}
	return strings.TrimSpace(strings.TrimPrefix(fmt.Sprint(v), "_|_ //"))
}

func maxPtr(p *int64, n int64) *int64 {
	if p == nil || n > *p {
		return &n
	}
	return p
}

func minPtr(p *int64, n int64) *int64 {
	if p == nil || n < *p {
		return &n
	}
	return p
}

// definitionOf returns the clean definition a field refers to (itself, or
// one conjunct of it), if any.
func (w *walker) definitionOf(v cue.Value) (cue.Value, bool) {
	cands := []cue.Value{v}
	if op, args := v.Expr(); op == cue.AndOp || op == cue.SelectorOp {
		cands = append(cands, args...)
	}
	for _, c := range cands {
		if _, p := c.ReferencePath(); len(p.Selectors()) > 0 && p.Selectors()[0].IsDefinition() {
			d := w.root.LookupPath(p)
			// A definition whose comprehensions need data (if use !=
			// "cart") evaluates to an incomplete error, yet its fields
			// can be iterated.
			if !d.Exists() {
				continue
			}
			if _, err := d.Fields(cue.Optional(true)); err == nil && (d.IncompleteKind() == cue.StructKind || d.IncompleteKind() == cue.BottomKind) {
				return d, true
			}
		}
	}
	return cue.Value{}, false
}

// object walks a struct value.
func (w *walker) object(v cue.Value, path string) (apiextv1.JSONSchemaProps, error) {
	props := apiextv1.JSONSchemaProps{Type: "object"}
	it, err := v.Fields(cue.Optional(true), cue.Patterns(true))
	if err != nil {
		return props, fmt.Errorf("%s: %w", path, err)
	}
	var keyRules []keyRule
	for it.Next() {
		sel := it.Selector()
		fv := it.Value()
		if sel.ConstraintType() == cue.PatternConstraint {
			kr, values, err := w.pattern(sel, fv, path)
			if err != nil {
				return props, err
			}
			if kr != nil {
				keyRules = append(keyRules, *kr)
			}
			if values != nil {
				if props.AdditionalProperties != nil {
					return props, fmt.Errorf("%s: more than one [string]: T pattern constrains values", path)
				}
				props.AdditionalProperties = &apiextv1.JSONSchemaPropsOrBool{Allows: true, Schema: values}
			}
			continue
		}
		if sel.LabelType() != cue.StringLabel {
			continue // hidden fields and definitions are not data
		}
		name := sel.Unquoted()
		fpath := join(path, name)
		child, err := w.value(fv, fpath)
		if err != nil {
			return props, err
		}
		if doc := docText(fv); doc != "" {
			child.Description = strings.TrimSpace(doc + " " + child.Description)
		}
		if props.Properties == nil {
			props.Properties = map[string]apiextv1.JSONSchemaProps{}
		}
		props.Properties[name] = child
		if sel.ConstraintType() == 0 || sel.ConstraintType() == cue.RequiredConstraint {
			_, hasDef := fv.Default()
			if sel.ConstraintType() == cue.RequiredConstraint || w.required[fpath] || (!hasDef && !w.notRequired[fpath]) {
				props.Required = append(props.Required, name)
			}
		}
	}
	sort.Strings(props.Required)
	for _, kr := range keyRules {
		if len(props.Properties) == 0 {
			// A map: the key rule is a CEL rule on it.
			props.XValidations = append(props.XValidations, kr.rule)
			continue
		}
		// A struct of fields: the rule rejects the keys it does not
		// declare (CUE reports an unknown field there), as the
		// structural schema does already; every field must pass it.
		for name := range props.Properties {
			if !kr.re.MatchString(name) {
				return props, fmt.Errorf("%s: field %s fails the key rule %s", path, name, kr.re)
			}
		}
	}
	// An open struct with neither fields nor patterns ({...}) keeps
	// whatever it is given.
	if props.Properties == nil && props.AdditionalProperties == nil && v.Allows(cue.AnyString) {
		t := true
		props.XPreserveUnknownFields = &t
	}
	return props, nil
}

// keyRule is a `[K=!~re]: error(…)` rule: the keys must match re.
type keyRule struct {
	re   *regexp.Regexp
	rule apiextv1.ValidationRule
}

// pattern handles `[K=!~re]: error(…)`, a key rule, and `[string]: T`,
// the schema of a map's values; a pattern of any string constraint
// (`[=~re]: T`) counts as `[string]: T`, and one whose values are
// unconstrained (`[=~re]: _`) adds nothing.
func (w *walker) pattern(sel cue.Selector, fv cue.Value, path string) (*keyRule, *apiextv1.JSONSchemaProps, error) {
	pat := sel.Pattern()
	if fv.Err() != nil {
		op, args := pat.Expr()
		if op != cue.NotRegexMatchOp {
			return nil, nil, fmt.Errorf("%s: only [!~re]: error(…) key rules are supported, got [%v]", path, pat)
		}
		re, err := args[0].String()
		if err != nil {
			return nil, nil, fmt.Errorf("%s: key pattern: %w", path, err)
		}
		cre, err := regexp.Compile(re)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: key pattern: %w", path, err)
		}
		msg, expr := keyMessage(fv)
		return &keyRule{re: cre, rule: apiextv1.ValidationRule{
			Rule:              fmt.Sprintf("self.all(k, k.matches(%s))", celString(re)),
			Message:           msg,
			MessageExpression: expr(fmt.Sprintf("self.filter(k, !k.matches(%s))[0]", celString(re))),
		}}, nil, nil
	}
	if pat.IncompleteKind() != cue.StringKind || pat.IsConcrete() {
		return nil, nil, fmt.Errorf("%s: only [string]: T maps are supported, got [%v]", path, pat)
	}
	if fv.IncompleteKind() == cue.TopKind {
		return nil, nil, nil
	}
	child, err := w.value(fv, path+"[*]")
	if err != nil {
		return nil, nil, err
	}
	return nil, &child, nil
}

// keyMessage returns the error() text of a key rule with the key label
// (\(K)) cut out, and a function building a CEL messageExpression that
// puts the offending key back in.
func keyMessage(fv cue.Value) (string, func(key string) string) {
	none := func(string) string { return "" }
	var call *ast.CallExpr
	ast.Walk(fv.Source(), func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok && call == nil {
			call = c
		}
		return call == nil
	}, nil)
	if call == nil || len(call.Args) != 1 {
		return errorText(fv), none
	}
	in, ok := call.Args[0].(*ast.Interpolation)
	if !ok {
		return errorText(fv), none
	}
	// Parts alternate: string fragment, expression, string fragment, …
	var text []string
	var cel []string
	for i, e := range in.Elts {
		if i%2 == 1 {
			cel = append(cel, "%KEY%")
			text = append(text, "a key")
			continue
		}
		lit, _ := e.(*ast.BasicLit)
		if lit == nil {
			return errorText(fv), none
		}
		s := lit.Value
		// Fragments keep their quote or \( … ) delimiters.
		if i == 0 {
			s = strings.TrimPrefix(s, `"`)
		} else {
			s = strings.TrimPrefix(s, ")")
		}
		if i == len(in.Elts)-1 {
			s = strings.TrimSuffix(s, `"`)
		} else {
			s = strings.TrimSuffix(s, `\(`)
		}
		if u, err := strconv.Unquote(`"` + s + `"`); err == nil {
			s = u
		}
		text = append(text, s)
		if s != "" {
			cel = append(cel, celString(s))
		}
	}
	msg := strings.TrimSpace(strings.Join(text, ""))
	return msg, func(key string) string {
		parts := make([]string, len(cel))
		for i, c := range cel {
			if c == "%KEY%" {
				c = key
			}
			parts[i] = c
		}
		return strings.Join(parts, " + ")
	}
}

// value walks any field value.
func (w *walker) value(v cue.Value, path string) (apiextv1.JSONSchemaProps, error) {
	if d, ok := w.definitionOf(v); ok {
		return w.object(d, path)
	}
	switch v.IncompleteKind() {
	case cue.StructKind:
		return w.object(v, path)
	case cue.ListKind:
		elem := v.LookupPath(cue.MakePath(cue.AnyIndex))
		items, err := w.value(elem, path+"[]")
		if err != nil {
			return items, err
		}
		return apiextv1.JSONSchemaProps{Type: "array", Items: &apiextv1.JSONSchemaPropsOrArray{Schema: &items}}, nil
	}
	var s scalar
	if err := w.collect(v, &s, 0); err != nil {
		return apiextv1.JSONSchemaProps{}, fmt.Errorf("%s: %w", path, err)
	}
	k := v.IncompleteKind()
	if s.kind != 0 {
		k &= s.kind
	}
	p := apiextv1.JSONSchemaProps{}
	switch k {
	case cue.StringKind:
		p.Type = "string"
	case cue.IntKind:
		p.Type = "integer"
	case cue.BoolKind:
		p.Type = "boolean"
	default:
		return p, fmt.Errorf("%s: unsupported kind %v", path, k)
	}
	for _, e := range s.enum {
		raw, err := jsonValue(e)
		if err != nil {
			return p, fmt.Errorf("%s: %w", path, err)
		}
		p.Enum = append(p.Enum, raw)
	}
	switch len(s.patterns) {
	case 0:
	case 1:
		p.Pattern = s.patterns[0]
	default:
		return p, fmt.Errorf("%s: %d patterns on one field", path, len(s.patterns))
	}
	if s.min != nil {
		x := float64(*s.min)
		p.Minimum = &x
	}
	if s.max != nil {
		x := float64(*s.max)
		p.Maximum = &x
	}
	p.MaxLength = s.maxLen
	// A fully anchored, bounded pattern implies a length limit; stating it
	// lets the CEL cost estimator bound the string. Not tighter than
	// patternSlack bytes: a value over maxLength gets the API server's
	// "Too long: may not be more than 5 bytes" and no rule runs, so a
	// 20-digit holdTimeout would never read the duration rule's message.
	if p.Pattern != "" {
		if n, ok := patternMaxLen(p.Pattern); ok {
			p.MaxLength = minPtr(p.MaxLength, max(n, patternSlack))
		}
	}
	if len(s.messages) > 0 {
		p.Description = "Rule: " + s.messages[0] + "."
		// The API server words a failed pattern, bound or enum as "should
		// match '<regex>'", "should be greater than or equal to 1", …; the
		// same check as a CEL rule says CUE's plain words, so kubectl and
		// autoconfig vet read alike. A regex over an unbounded string (a
		// label selector) is over the CEL cost budget and stays a pattern.
		var conds []string
		if p.Pattern != "" && p.MaxLength != nil {
			conds = append(conds, fmt.Sprintf("self.matches(%s)", celString(p.Pattern)))
			p.Pattern = ""
		}
		if p.Minimum != nil {
			conds = append(conds, fmt.Sprintf("self >= %d", *s.min))
			p.Minimum = nil
		}
		if p.Maximum != nil {
			conds = append(conds, fmt.Sprintf("self <= %d", *s.max))
			p.Maximum = nil
		}
		if len(p.Enum) > 0 {
			vals := make([]string, len(p.Enum))
			for i, e := range p.Enum {
				vals[i] = string(e.Raw)
			}
			// The enum stays in the schema too (kubectl explain lists
			// the values); the rule adds CUE's words to the API server's.
			conds = append(conds, fmt.Sprintf("self in [%s]", strings.Join(vals, ", ")))
		}
		if len(conds) > 0 {
			p.XValidations = append(p.XValidations, apiextv1.ValidationRule{Rule: strings.Join(conds, " && "), Message: s.messages[0]})
		}
	}
	if d, ok := v.Default(); ok && d.IsConcrete() {
		var x any
		if err := d.Decode(&x); err == nil {
			// The API server fills the same default CUE gives (kubectl
			// explain shows it; the stored object says what applies).
			raw, err := jsonValue(x)
			if err != nil {
				return p, fmt.Errorf("%s: default: %w", path, err)
			}
			p.Default = &raw
			p.Description = strings.TrimSpace(fmt.Sprintf("%s Default: %v.", p.Description, x))
		}
	}
	return p, nil
}

func jsonValue(x any) (apiextv1.JSON, error) {
	switch t := x.(type) {
	case string:
		return apiextv1.JSON{Raw: []byte(strconv.Quote(t))}, nil
	case bool:
		return apiextv1.JSON{Raw: []byte(strconv.FormatBool(t))}, nil
	default:
		return apiextv1.JSON{Raw: []byte(fmt.Sprint(t))}, nil
	}
}

func docText(v cue.Value) string {
	var parts []string
	for _, c := range v.Doc() {
		parts = append(parts, strings.Join(strings.Fields(c.Text()), " "))
	}
	return strings.Join(parts, " ")
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// celString quotes s as a CEL string literal.
func celString(s string) string {
	return strconv.Quote(s)
}

// patternMaxLen returns the longest string (in runes) a regex accepts when
// every alternative is anchored at both ends and has no unbounded repeat.
// patternSlack is the least maxLength a pattern implies (patternMaxLen).
const patternSlack = 64

func patternMaxLen(re string) (int64, bool) {
	r, err := syntax.Parse(re, syntax.Perl)
	if err != nil {
		return 0, false
	}
	r = r.Simplify()
	alts := []*syntax.Regexp{r}
	if r.Op == syntax.OpAlternate {
		alts = r.Sub
	}
	var best int64
	for _, a := range alts {
		if a.Op != syntax.OpConcat || len(a.Sub) < 2 || a.Sub[0].Op != syntax.OpBeginText || a.Sub[len(a.Sub)-1].Op != syntax.OpEndText {
			return 0, false
		}
		n, ok := maxLen(a)
		if !ok {
			return 0, false
		}
		if n > best {
			best = n
		}
	}
	return best, true
}

func maxLen(r *syntax.Regexp) (int64, bool) {
	switch r.Op {
	case syntax.OpEmptyMatch, syntax.OpBeginText, syntax.OpEndText, syntax.OpBeginLine, syntax.OpEndLine, syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return 0, true
	case syntax.OpLiteral:
		return int64(len(r.Rune)), true
	case syntax.OpCharClass, syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		return 1, true
	case syntax.OpCapture, syntax.OpQuest:
		return maxLen(r.Sub[0])
	case syntax.OpRepeat:
		if r.Max < 0 {
			return 0, false
		}
		n, ok := maxLen(r.Sub[0])
		return n * int64(r.Max), ok
	case syntax.OpConcat:
		var sum int64
		for _, s := range r.Sub {
			n, ok := maxLen(s)
			if !ok {
				return 0, false
			}
			sum += n
		}
		return sum, true
	case syntax.OpAlternate:
		var best int64
		for _, s := range r.Sub {
			n, ok := maxLen(s)
			if !ok {
				return 0, false
			}
			if n > best {
				best = n
			}
		}
		return best, true
	}
	return 0, false
}
