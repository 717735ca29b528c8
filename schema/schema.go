// Package schema embeds the ModelRoute CUE schema and validates route
// documents against it. It is the only package that evaluates CUE: callers
// validate and default a route once per spec generation, then render in Go.
package schema

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"cuelang.org/go/cue"
	"cuelang.org/go/cue/ast"
	"cuelang.org/go/cue/cuecontext"
	cueerrors "cuelang.org/go/cue/errors"
	"cuelang.org/go/cue/literal"
	"cuelang.org/go/cue/token"
	cuejson "cuelang.org/go/encoding/json"
	cueyaml "cuelang.org/go/encoding/yaml"
	"gopkg.in/yaml.v3"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// FS holds the CUE module: cue.mod/module.cue and the schema files.
//
//go:embed cue.mod/module.cue *.cue
var FS embed.FS

// SchemaFile is the schema's file name inside FS; CUE error positions that
// point into the schema use it.
const SchemaFile = "modelroute.cue"

// Definition is the CUE definition a route document is checked against.
const Definition = "#ModelRoute"

// Validator checks route documents against the compiled schema. It is safe
// for concurrent use: a cue.Context and the values built from it are not, so
// every evaluation holds mu. Validation is per spec generation, not per
// endpoint change, so the lock is not on a hot path.
type Validator struct {
	mu  sync.Mutex
	ctx *cue.Context
	def cue.Value
}

var (
	defaultOnce sync.Once
	defaultV    *Validator
	defaultErr  error
)

// Default returns the process-wide Validator, compiling the schema once.
func Default() (*Validator, error) {
	defaultOnce.Do(func() { defaultV, defaultErr = New() })
	return defaultV, defaultErr
}

// New compiles the embedded schema.
func New() (*Validator, error) {
	src, err := FS.ReadFile(SchemaFile)
	if err != nil {
		return nil, fmt.Errorf("read embedded schema: %w", err)
	}
	ctx := cuecontext.New()
	v := ctx.CompileBytes(src, cue.Filename("schema/"+SchemaFile))
	if err := v.Err(); err != nil {
		return nil, fmt.Errorf("compile schema: %w", err)
	}
	def := v.LookupPath(cue.ParsePath(Definition))
	// def.Err would report the definition's incomplete values (it has no
	// data yet); existence is what matters here.
	if !def.Exists() {
		return nil, fmt.Errorf("schema has no %s", Definition)
	}
	return &Validator{ctx: ctx, def: def}, nil
}

// Problem is one validation failure, located in the input document.
type Problem struct {
	// File and Line locate the offending value in the input (Line 0 when the
	// field is missing: then it is the document's first line).
	File string `json:"file"`
	Line int    `json:"line"`
	// Path is the field path, e.g. spec.nginx.route.
	Path string `json:"path"`
	// Message says what is wrong and what to do.
	Message string `json:"message"`
}

func (p Problem) String() string {
	if p.Path == "" {
		return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Message)
	}
	return fmt.Sprintf("%s:%d: %s: %s", p.File, p.Line, p.Path, p.Message)
}

// InvalidError is returned for a document that breaks the schema.
type InvalidError struct {
	Problems []Problem
}

func (e *InvalidError) Error() string {
	s := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		s[i] = p.String()
	}
	return strings.Join(s, "\n")
}

// Document is one validated route of a (multi-document) file.
type Document struct {
	// OtherKind is set for a Kubernetes object of another kind
	// ("apiVersion kind"): not validated, not a route.
	OtherKind string
	// File and Line locate the document's start.
	File string
	Line int
	// Route is the defaulted route; nil when Err is set.
	Route *v1alpha1.ModelRoute
	// Err is an *InvalidError for a document that breaks the schema, or a
	// parse error.
	Err error
}

// ValidateStream validates every YAML document of src. A YAML syntax error
// ends the stream with one Document carrying the error.
func (v *Validator) ValidateStream(filename string, src []byte) []Document {
	v.mu.Lock()
	defer v.mu.Unlock()
	var docs []Document
	if json.Valid(src) {
		// A JSON document (kubectl get -o json) may hold U+FFFE and
		// U+FFFF raw, which YAML (JSON's superset otherwise) refuses as
		// control characters; in valid JSON they can only be inside
		// strings, where the escapes mean the same.
		src = bytes.ReplaceAll(bytes.ReplaceAll(src, []byte("\ufffe"), []byte(`\ufffe`)), []byte("\uffff"), []byte(`\uffff`))
	}
	dec := cueyaml.NewDecoder(filename, bytes.NewReader(src))
	for {
		expr, err := extract(dec)
		if errors.Is(err, io.EOF) {
			break
		}
		var crash *decoderPanic
		if errors.As(err, &crash) {
			// Valid YAML that CUE's decoder cannot place: read the
			// whole stream with yaml.v3 instead (data only; the
			// comments the CUE decoder tripped over do not matter).
			return v.validatePlain(filename, src)
		}
		if err != nil {
			line := yamlErrLine(err)
			docs = append(docs, Document{File: filename, Line: line, Err: fmt.Errorf("%s:%d: parse yaml: %s", filename, line, yamlErrMsg(err))})
			break
		}
		line := expr.Pos().Line()
		if isEmptyDoc(expr) {
			continue
		}
		if other := otherKind(stringField(expr, "apiVersion"), stringField(expr, "kind")); other != "" {
			docs = append(docs, Document{File: filename, Line: line, OtherKind: other})
			continue
		}
		// BuildExpr, not CompileBytes: a long-lived cue.Context keeps every
		// file it compiles for good (yaml.Extract + BuildFile retains ~20 KB
		// per document); BuildExpr on the extracted expression stays flat.
		data := v.ctx.BuildExpr(expr)
		r, err := v.check(filename, line, data)
		docs = append(docs, Document{File: filename, Line: line, Route: r, Err: err})
	}
	return docs
}

// extract reads the next YAML document. CUE's YAML decoder (v0.17.1)
// panics on some inputs (an index out of range in its comment placement);
// that is a parse error of this document, never a crash of vet or of the
// caller.
func extract(dec *cueyaml.Decoder) (expr ast.Expr, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &decoderPanic{p}
		}
	}()
	return dec.Extract()
}

// decoderPanic is a panic of CUE's YAML decoder.
type decoderPanic struct{ v any }

func (d *decoderPanic) Error() string { return fmt.Sprintf("YAML decoder failed: %v", d.v) }

// validatePlain validates every document of src read by yaml.v3 as plain
// data, through JSON as ValidateObject does: the fallback for YAML that
// CUE's decoder panics on. Lines are the documents' first lines. The
// caller holds v.mu.
func (v *Validator) validatePlain(filename string, src []byte) []Document {
	var docs []Document
	dec := yaml.NewDecoder(bytes.NewReader(src))
	for {
		var node yaml.Node
		err := dec.Decode(&node)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			docs = append(docs, Document{File: filename, Err: fmt.Errorf("%s: parse yaml: %w", filename, err)})
			break
		}
		var data any
		if err := node.Decode(&data); err != nil {
			docs = append(docs, Document{File: filename, Line: node.Line, Err: fmt.Errorf("%s:%d: parse yaml: %w", filename, node.Line, err)})
			continue
		}
		if data == nil {
			continue
		}
		if m, ok := data.(map[string]any); ok {
			av, _ := m["apiVersion"].(string)
			k, _ := m["kind"].(string)
			if other := otherKind(av, k); other != "" {
				docs = append(docs, Document{File: filename, Line: node.Line, OtherKind: other})
				continue
			}
		}
		b, err := json.Marshal(data)
		if err != nil {
			docs = append(docs, Document{File: filename, Line: node.Line, Err: fmt.Errorf("%s:%d: %w", filename, node.Line, err)})
			continue
		}
		expr, err := cuejson.Extract(filename, escapeBOM(b))
		if err != nil {
			docs = append(docs, Document{File: filename, Line: node.Line, Err: fmt.Errorf("%s:%d: %w", filename, node.Line, err)})
			continue
		}
		r, err := v.check(filename, node.Line, v.ctx.BuildExpr(expr))
		docs = append(docs, Document{File: filename, Line: node.Line, Route: r, Err: err})
	}
	return docs
}

// escapeBOM writes U+FEFF in JSON text as an escape: encoding/json writes
// it raw, and CUE's JSON scanner refuses it anywhere ("invalid JSON"),
// while the API server and YAML accept it in a string. Raw U+FEFF bytes can
// only be inside strings in encoding/json's output.
func escapeBOM(b []byte) []byte {
	return bytes.ReplaceAll(b, []byte("\ufeff"), []byte(`\ufeff`))
}

// Validate validates a single-document route and returns it defaulted.
func (v *Validator) Validate(filename string, src []byte) (*v1alpha1.ModelRoute, error) {
	docs := v.ValidateStream(filename, src)
	if len(docs) != 1 {
		return nil, fmt.Errorf("%s: want exactly one ModelRoute document, found %d", filename, len(docs))
	}
	return docs[0].Route, docs[0].Err
}

// ValidateObject validates a route given as a Go object (e.g. read from the
// API server) and returns a defaulted copy. Status is ignored.
func (v *Validator) ValidateObject(in *v1alpha1.ModelRoute) (*v1alpha1.ModelRoute, error) {
	doc := map[string]any{
		"apiVersion": v1alpha1.APIVersion,
		"kind":       v1alpha1.Kind,
		"metadata":   map[string]any{"name": in.Name, "namespace": in.Namespace},
		"spec":       in.Spec,
	}
	if in.Namespace == "" {
		delete(doc["metadata"].(map[string]any), "namespace")
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encode route: %w", err)
	}
	// So the stored route and `autoconfig vet` of the same bytes get the
	// same verdict.
	b = escapeBOM(b)
	name := in.Namespace + "/" + in.Name
	// Extract + BuildExpr, not CompileBytes: the controller validates every
	// spec generation for the life of the process, and a long-lived
	// cue.Context keeps every file it compiles (~20 KB per document, never
	// released); BuildExpr on the extracted expression stays flat.
	expr, err := cuejson.Extract(name, b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	r, err := v.check(name, 1, v.ctx.BuildExpr(expr))
	if err != nil {
		return nil, err
	}
	r.ObjectMeta = *in.ObjectMeta.DeepCopy()
	r.Status = in.Status
	return r, nil
}

// check unifies data-first (so error paths read spec.…), validates concrete
// and decodes into the Go types. The caller holds v.mu.
func (v *Validator) check(filename string, line int, data cue.Value) (*v1alpha1.ModelRoute, error) {
	u := data.Unify(v.def)
	if err := u.Validate(cue.Concrete(true), cue.Final()); err != nil {
		return nil, &InvalidError{Problems: problems(filename, line, err)}
	}
	var r v1alpha1.ModelRoute
	if err := u.Decode(&r); err != nil {
		return nil, fmt.Errorf("%s:%d: decode route: %w", filename, line, err)
	}
	return &r, nil
}

// problems turns CUE errors into located, deduplicated Problems. The line is
// the first position inside the input file; the message is CUE's, which for
// every rule is the schema's plain-words error() text.
func problems(filename string, docLine int, err error) []Problem {
	seen := map[string]bool{}
	var out []Problem
	for _, e := range cueerrors.Errors(err) {
		format, args := e.Msg()
		msg := fmt.Sprintf(format, args...)
		if strings.HasSuffix(msg, "errors in empty disjunction:") {
			// A summary line; the disjuncts' own errors follow it.
			continue
		}
		path := strings.Join(e.Path(), ".")
		if f, ok := strings.CutPrefix(msg, "required field missing: "); ok {
			// CUE names the missing field in the message, not the path.
			path = strings.TrimPrefix(path+"."+f, ".")
			msg = "field is required but not present"
		}
		// Two failures CUE reports without a useful path: a missing
		// metadata.name (seen through the rule guard _named) and a peer
		// without use (seen through the rules comparing it).
		switch {
		case path == "_named":
			path, msg = "metadata.name", "field is required but not present"
		case strings.Contains(msg, `non-concrete value =~"^(cart|backend|backend-svc)$"`):
			path, msg = "spec.nginx.peers", "every peer needs use: cart, backend or backend-svc; add it"
		}
		line := 0
		for _, p := range append([]token.Pos{e.Position()}, e.InputPositions()...) {
			if p.IsValid() && p.Filename() == filename {
				line = p.Line()
				break
			}
		}
		if line == 0 {
			line = docLine
		}
		p := Problem{File: filename, Line: line, Path: path, Message: humanize(msg)}
		if k := p.String(); !seen[k] {
			seen[k] = true
			out = append(out, p)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Line != out[j].Line {
			return out[i].Line < out[j].Line
		}
		return out[i].Path < out[j].Path
	})
	return out
}

// humanize rewrites CUE's generic messages (for the few failures that have
// no error() of their own) into words that say what to do.
func humanize(msg string) string {
	switch {
	case msg == "field is required but not present", strings.HasPrefix(msg, "incomplete value"):
		return "this field is required; add it"
	case strings.HasPrefix(msg, "field not allowed"):
		return "unknown field; remove it or check its spelling against the ModelRoute reference"
	case strings.Contains(msg, "(mismatched types"):
		return msg + "; give the type the ModelRoute reference names (quote strings such as values: {x: \"30\"})"
	}
	return msg
}

// yamlErrPos matches the "file:line: " a YAML decoder error starts with.
var yamlErrPos = regexp.MustCompile(`^(?:.*?:)?(\d+): `)

// yamlErrLine is the line of a YAML syntax error: its CUE position, else
// the line the decoder's message names.
func yamlErrLine(err error) int {
	for _, e := range cueerrors.Errors(err) {
		if p := e.Position(); p.IsValid() {
			return p.Line()
		}
	}
	if m := yamlErrPos.FindStringSubmatch(yamlErrMsgRaw(err)); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return 0
}

func yamlErrMsgRaw(err error) string { return err.Error() }

// yamlErrMsg is the decoder's message without its own "file:line: ".
func yamlErrMsg(err error) string {
	msg := yamlErrMsgRaw(err)
	if loc := yamlErrPos.FindStringIndex(msg); loc != nil {
		return msg[loc[1]:]
	}
	return msg
}

// otherKind is "apiVersion kind" for an object that is clearly not a
// ModelRoute: it names a kind, and neither that kind nor its apiVersion is
// the ModelRoute's. A document without a kind, or with only one of the two
// right, is validated (and its mistake reported).
func otherKind(apiVersion, kind string) string {
	if kind == "" || kind == v1alpha1.Kind || strings.HasPrefix(apiVersion, v1alpha1.Group+"/") {
		return ""
	}
	return strings.TrimSpace(apiVersion + " " + kind)
}

// stringField is the string literal of a top-level field of a document.
func stringField(expr ast.Expr, name string) string {
	st, ok := expr.(*ast.StructLit)
	if !ok {
		return ""
	}
	for _, d := range st.Elts {
		f, ok := d.(*ast.Field)
		if !ok {
			continue
		}
		if l, _, _ := ast.LabelName(f.Label); l != name {
			continue
		}
		if lit, ok := f.Value.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if v, err := literal.Unquote(lit.Value); err == nil {
				return v
			}
		}
	}
	return ""
}

// isEmptyDoc reports a document that holds nothing (a trailing `---` or a
// file of comments), which is skipped rather than reported.
func isEmptyDoc(expr ast.Expr) bool {
	lit, ok := expr.(*ast.BasicLit)
	return ok && lit.Kind == token.NULL
}
