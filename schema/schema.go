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
	goccyyaml "github.com/goccy/go-yaml"
	goccyparser "github.com/goccy/go-yaml/parser"
	"gopkg.in/yaml.v3"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
	"github.com/modelsphere/autoconfig/schema/yamlscan"
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
	// File, Line and Column locate the problem in the input: the value of
	// a bad value, the key of an unknown field, the document's start for
	// a missing field (Column 0 when only the line is known).
	File   string `json:"file"`
	Line   int    `json:"line"`
	Column int    `json:"column,omitempty"`
	// Path is the field path, e.g. spec.nginx.route.
	Path string `json:"path"`
	// Message says what is wrong and what to do.
	Message string `json:"message"`
}

func (p Problem) String() string {
	loc := fmt.Sprintf("%s:%d", p.File, p.Line)
	if p.Column > 0 {
		loc += fmt.Sprintf(":%d", p.Column)
	}
	if p.Path == "" {
		return loc + ": " + p.Message
	}
	return loc + ": " + p.Path + ": " + p.Message
}

// InvalidError is returned for a document that breaks the schema, repeats
// a mapping key, or is in a file refused before parsing (too large or too
// deeply nested).
type InvalidError struct {
	Problems []Problem

	duplicates bool // Problems are repeated keys
}

func (e *InvalidError) Error() string {
	s := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		s[i] = p.String()
	}
	return strings.Join(s, "\n")
}

// SyntaxError is a YAML document that cannot be parsed.
type SyntaxError struct {
	File         string
	Line, Column int // Column 0 when only the line is known
	Message      string
}

func (e *SyntaxError) Error() string {
	return Problem{File: e.File, Line: e.Line, Column: e.Column, Message: "parse yaml: " + e.Message}.String()
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

	// v and tree locate the document's fields (Problem); tree is nil when
	// the input's positions are not known.
	v    *Validator
	tree ast.Expr
}

// Problem is a problem about the field at path (spec.monitor.outputConfigMap)
// found outside the schema, located as validation locates its problems:
// the field's value or key, else the nearest enclosing field, else the
// document's line.
func (d Document) Problem(path, message string) Problem {
	p := Problem{File: d.File, Line: d.Line, Path: path, Message: message}
	if d.v != nil && d.tree != nil {
		d.v.mu.Lock()
		pos := d.v.position(d.tree, strings.Split(path, "."))
		d.v.mu.Unlock()
		if pos.IsValid() {
			p.Line, p.Column = pos.Line(), pos.Column()
		}
	}
	return p
}

// routeDoc words the messages of a route file refused before parsing: a
// ModelRoute needs fewer than 15 levels of nesting (spec.nginx.peers.0.…
// is 5 deep, metadata.managedFields about 10) and is 1-5 KB.
var routeDoc = yamlscan.Doc{Name: "a ModelRoute", Depth: 15, TooLarge: "split it into several files"}

// routeCounts bounds one route document before the schema evaluates it:
// CUE's time and memory grow with every value (10,000 peers, 200 KB, took
// 3.7 s and 420 MB to be refused; 20,000 labels 1.4 s and 190 MB). The
// CRD allows 3 peers and 64 values; a route read back from a cluster,
// managedFields included, has a few hundred nodes.
var routeCounts = yamlscan.Counts{Entries: 1000, Nodes: 5000}

// The route documents of one file are bounded together, in proportion to
// the file's size, as routeCounts bounds one: the schema spends about a
// millisecond on every route document however small (29,000 empty
// documents `--- {}` in 200 KB took 21 s and 8 GB allocated; 1,138
// minimal routes 1.0 s) and 0.004-0.16 ms on every value (a peer costs
// the most, so it counts as PeerValues more). A file may hold one route document per RouteBytes bytes and one
// value per ValueBytes bytes, and at least MinFileRoutes and
// MinFileValues: the schema's time then grows with the file's bytes (200
// KB of any shape within about 0.9 s), while an ordinary route (1-5 KB,
// managedFields included) is far inside both, so `kustomize build |
// autoconfig vet -` of hundreds of routes is one file.
const (
	MinFileRoutes = 100
	RouteBytes    = 256
	MinFileValues = 20000
	ValueBytes    = 4
	// PeerValues is what one entry of spec.nginx.peers counts among a
	// file's values besides its own nodes: the schema spends up to 0.16
	// ms on a peer, 40 times a plain value (a route has at most 3).
	PeerValues = 40
)

// FileBounds are the most ModelRoute documents, and values in them, that
// a file of size bytes may hold.
func FileBounds(size int) (routes, values int) {
	return max(MinFileRoutes, size/RouteBytes), max(MinFileValues, size/ValueBytes)
}

// ValidateStream validates every YAML document of src. A YAML syntax error
// ends the stream with one Document carrying the error. A file larger than
// yamlscan.MaxBytes or nested deeper than yamlscan.MaxDepth is refused
// before any parser sees it (one Document with an *InvalidError), and so
// is a file that is not UTF-8 (a *SyntaxError at the byte), and one whose
// route documents are more than routeCounts allows alone or FileBounds
// together. The items of a List (kind List, as `kubectl get -o yaml`
// prints, or ModelRouteList) are documents of their own, each at its
// item's line. A route whose mappings repeat a key gets an
// *InvalidError naming each repeat and the key it repeats, instead of the
// schema's verdict on whichever value the parser kept.
func (v *Validator) ValidateStream(filename string, src []byte) []Document {
	if err := yamlscan.Check(src, routeDoc); err != nil {
		var e *yamlscan.Error
		errors.As(err, &e)
		if e.Kind == yamlscan.NotUTF8 {
			return []Document{{File: filename, Line: e.Line, Err: &SyntaxError{File: filename, Line: e.Line, Column: e.Column, Message: e.Message}}}
		}
		return []Document{{File: filename, Line: e.Line, Err: &InvalidError{Problems: []Problem{{File: filename, Line: e.Line, Column: e.Column, Message: e.Message}}}}}
	}
	if json.Valid(src) {
		// A JSON document (kubectl get -o json) may hold U+FFFE and
		// U+FFFF raw, which YAML (JSON's superset otherwise) refuses as
		// control characters; in valid JSON they can only be inside
		// strings, where the escapes mean the same. Before the bounds:
		// yaml.v3 refuses them too, which left such a file unbounded
		// (8,000 peers and one U+FFFE: 2.3 s and 358 MB).
		src = bytes.ReplaceAll(bytes.ReplaceAll(src, []byte("\ufffe"), []byte(`\ufffe`)), []byte("\uffff"), []byte(`\uffff`))
	}
	if e := tooMany(src); e != nil {
		return []Document{{File: filename, Line: e.Line, Err: &InvalidError{Problems: []Problem{{File: filename, Line: e.Line, Column: e.Column, Message: e.Message}}}}}
	}
	v.mu.Lock()
	docs := v.validateStream(filename, src)
	v.mu.Unlock()
	return withDuplicates(docs, src)
}

// tooMany is the first route document of src (a List's items count one
// by one) that is larger than routeCounts, or the first that takes the
// file past FileBounds, read by yaml.v3 (milliseconds for a 4 MiB file).
// Documents of other kinds (a CRD has thousands of nodes) and empty ones
// are not bounded: vet skips them. A syntax error ends the scan; the
// schema reports it.
func tooMany(src []byte) *yamlscan.Error {
	maxRoutes, maxValues := FileBounds(len(src))
	dec := yaml.NewDecoder(bytes.NewReader(src))
	routes, values := 0, 0
	for {
		var node yaml.Node
		if err := dec.Decode(&node); err != nil {
			return nil
		}
		if len(node.Content) != 1 {
			continue
		}
		docs := []*yaml.Node{&node}
		if items, ok := listNodeItems(node.Content[0]); ok {
			docs = items
		}
		for _, doc := range docs {
			top := doc
			if doc.Kind == yaml.DocumentNode {
				top = doc.Content[0]
			}
			switch {
			case top.Kind == yaml.ScalarNode && top.ShortTag() == "!!null":
				continue // an empty document
			case top.Kind == yaml.MappingNode:
				var head struct {
					APIVersion string `yaml:"apiVersion"`
					Kind       string `yaml:"kind"`
				}
				if top.Decode(&head) == nil && otherKind(head.APIVersion, head.Kind) != "" {
					continue
				}
			}
			n, err := yamlscan.Count(doc, routeCounts, routeDoc)
			if err != nil {
				var e *yamlscan.Error
				errors.As(err, &e)
				return e
			}
			if p := mappingPath(top, "spec", "nginx", "peers"); p != nil && p.Kind == yaml.SequenceNode {
				n += PeerValues * len(p.Content)
			}
			if routes++; routes > maxRoutes {
				return &yamlscan.Error{Kind: yamlscan.TooMany, Line: top.Line, Column: top.Column, Message: fmt.Sprintf(
					"this is ModelRoute document %d of the file, more than %d, the limit for a file of %d bytes (one route per %d bytes, at least %d: it bounds the schema's work, about a millisecond a route, however small): split the file (vet takes a directory)",
					routes, maxRoutes, len(src), RouteBytes, MinFileRoutes)}
			}
			if values += n; values > maxValues && routes == 1 {
				return &yamlscan.Error{Kind: yamlscan.TooMany, Line: top.Line, Column: top.Column, Message: fmt.Sprintf(
					"the document has %d values (a peer counts as %d), more than %d, the limit for a file of %d bytes (one value per %d bytes, at least %d: it bounds the schema's work; a route has a few dozen to a few hundred, and at most 3 peers): shorten it",
					values, PeerValues, maxValues, len(src), ValueBytes, MinFileValues)}
			}
			if values > maxValues {
				return &yamlscan.Error{Kind: yamlscan.TooMany, Line: top.Line, Column: top.Column, Message: fmt.Sprintf(
					"with this document the file's ModelRoute documents have %d values (a peer counts as %d), more than %d, the limit for a file of %d bytes (one value per %d bytes, at least %d: it bounds the schema's work; a route has a few dozen to a few hundred): split the file (vet takes a directory)",
					values, PeerValues, maxValues, len(src), ValueBytes, MinFileValues)}
			}
		}
	}
}

// isList reports a List of objects: kind List (apiVersion v1, what
// `kubectl get -o yaml` prints for several objects) or ModelRouteList.
func isList(apiVersion, kind string) bool {
	return (kind == "List" && apiVersion == "v1") || (kind == v1alpha1.Kind+"List" && strings.HasPrefix(apiVersion, v1alpha1.Group+"/"))
}

// listNodeItems are the item nodes of a List document's top mapping.
func listNodeItems(top *yaml.Node) ([]*yaml.Node, bool) {
	if top.Kind != yaml.MappingNode {
		return nil, false
	}
	var head struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
	}
	if top.Decode(&head) != nil || !isList(head.APIVersion, head.Kind) {
		return nil, false
	}
	items := mappingPath(top, "items")
	if items == nil || items.Kind != yaml.SequenceNode {
		return nil, true
	}
	return items.Content, true
}

// mappingPath is the node at the keys below mapping n (nil when absent).
func mappingPath(n *yaml.Node, keys ...string) *yaml.Node {
	for _, k := range keys {
		if n == nil || n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == k {
				next = n.Content[i+1]
			}
		}
		n = next
	}
	return n
}

// withDuplicates replaces the verdict on every route document whose
// mappings repeat a key by the repeats. The documents are found by line:
// a repeat belongs to the last document starting before it.
func withDuplicates(docs []Document, src []byte) []Document {
	dec := yaml.NewDecoder(bytes.NewReader(src))
	for {
		var node yaml.Node
		if err := dec.Decode(&node); err != nil {
			// io.EOF, or a syntax error the documents already report
			return docs
		}
		for _, d := range yamlscan.Duplicates(&node) {
			i := len(docs) - 1
			for i > 0 && docs[i].Line > d.Line {
				i--
			}
			if i < 0 || docs[i].OtherKind != "" || docs[i].Line > d.Line {
				continue
			}
			doc := &docs[i]
			var inv *InvalidError
			if doc.Route != nil || !errors.As(doc.Err, &inv) || !inv.duplicates {
				inv = &InvalidError{duplicates: true}
				doc.Route, doc.Err = nil, inv
			}
			inv.Problems = append(inv.Problems, Problem{File: doc.File, Line: d.Line, Column: d.Column, Path: d.Path, Message: d.Message()})
		}
	}
}

func (v *Validator) validateStream(filename string, src []byte) []Document {
	var docs []Document
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
			line, col := yamlErrPos(err)
			msg := yamlErrMsg(err)
			if l, c, m, ok := syntaxErrorAt(src, line); ok {
				line, col, msg = l, c, m
			}
			docs = append(docs, Document{File: filename, Line: line, Err: &SyntaxError{File: filename, Line: line, Column: col, Message: msg}})
			break
		}
		if items, ok := listItems(expr); ok {
			for _, item := range items {
				if d, ok := v.document(filename, item); ok {
					docs = append(docs, d)
				}
			}
			continue
		}
		if d, ok := v.document(filename, expr); ok {
			docs = append(docs, d)
		}
	}
	return docs
}

// document is the verdict on one document (or List item) expr; ok is
// false for an empty one.
func (v *Validator) document(filename string, expr ast.Expr) (Document, bool) {
	line := expr.Pos().Line()
	if isEmptyDoc(expr) {
		return Document{}, false
	}
	if other := otherKind(stringField(expr, "apiVersion"), stringField(expr, "kind")); other != "" {
		return Document{File: filename, Line: line, OtherKind: other}, true
	}
	if _, ok := expr.(*ast.StructLit); !ok {
		// The schema's own message would print the whole definition
		// (14 KB for `--- 1`).
		return notMapping(filename, expr.Pos().Line(), expr.Pos().Column(), describeExpr(expr)), true
	}
	// BuildExpr, not CompileBytes: a long-lived cue.Context keeps every
	// file it compiles for good (yaml.Extract + BuildFile retains ~20 KB
	// per document); BuildExpr on the extracted expression stays flat.
	r, err := v.check(filename, expr.Pos(), expr, true)
	return Document{File: filename, Line: line, Route: r, Err: err, v: v, tree: expr}, true
}

// listItems are the items of a List document (isList), each judged as a
// document of its own at its own position.
func listItems(expr ast.Expr) ([]ast.Expr, bool) {
	st, ok := expr.(*ast.StructLit)
	if !ok || !isList(stringField(expr, "apiVersion"), stringField(expr, "kind")) {
		return nil, false
	}
	for _, d := range st.Elts {
		f, ok := d.(*ast.Field)
		if !ok {
			continue
		}
		if l, _, _ := ast.LabelName(f.Label); l != "items" {
			continue
		}
		if list, ok := f.Value.(*ast.ListLit); ok {
			return list.Elts, true
		}
	}
	return nil, true
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
		nodes := []*yaml.Node{&node}
		if len(node.Content) == 1 {
			if items, ok := listNodeItems(node.Content[0]); ok {
				nodes = items
			}
		}
		for _, n := range nodes {
			if d, ok := v.plainDocument(filename, n); ok {
				docs = append(docs, d)
			}
		}
	}
	return docs
}

// plainDocument is validatePlain's verdict on one document (or List
// item) node; ok is false for an empty one.
func (v *Validator) plainDocument(filename string, node *yaml.Node) (Document, bool) {
	var data any
	if err := node.Decode(&data); err != nil {
		return Document{File: filename, Line: node.Line, Err: fmt.Errorf("%s:%d: parse yaml: %w", filename, node.Line, err)}, true
	}
	if data == nil {
		return Document{}, false
	}
	m, ok := data.(map[string]any)
	if !ok {
		return notMapping(filename, node.Line, 0, fmt.Sprintf("a %T", data)), true
	}
	av, _ := m["apiVersion"].(string)
	k, _ := m["kind"].(string)
	if other := otherKind(av, k); other != "" {
		return Document{File: filename, Line: node.Line, OtherKind: other}, true
	}
	b, err := json.Marshal(data)
	if err != nil {
		return Document{File: filename, Line: node.Line, Err: fmt.Errorf("%s:%d: %w", filename, node.Line, err)}, true
	}
	expr, err := cuejson.Extract(filename, escapeBOM(b))
	if err != nil {
		return Document{File: filename, Line: node.Line, Err: fmt.Errorf("%s:%d: %w", filename, node.Line, err)}, true
	}
	r, err := v.check(filename, lineOnly(filename, node.Line), expr, false)
	return Document{File: filename, Line: node.Line, Route: r, Err: err}, true
}

// notMapping is a document that is not a mapping (a scalar or a list),
// which no ModelRoute can be; what describes it.
func notMapping(filename string, line, col int, what string) Document {
	return Document{File: filename, Line: line, Err: &InvalidError{Problems: []Problem{{File: filename, Line: line, Column: col,
		Message: fmt.Sprintf("a ModelRoute document is a mapping of fields (apiVersion, kind, metadata, spec), not %s", what)}}}}
}

// describeExpr names a document's value for notMapping: a scalar by its
// text (cut at 40 bytes), else its kind.
func describeExpr(expr ast.Expr) string {
	switch x := expr.(type) {
	case *ast.BasicLit:
		if r := []rune(x.Value); len(r) > 40 {
			return string(r[:40]) + "…"
		}
		return x.Value
	case *ast.ListLit:
		return "a list"
	}
	return fmt.Sprintf("%T", expr)
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
	r, err := v.check(name, lineOnly(name, 1), expr, false)
	if err != nil {
		return nil, err
	}
	r.ObjectMeta = *in.ObjectMeta.DeepCopy()
	r.Status = in.Status
	return r, nil
}

// yamlErrAt matches the "file:line: " a YAML decoder error starts with.
var yamlErrAt = regexp.MustCompile(`^(?:.*?:)?(\d+): `)

// syntaxWindow is the most of a file the second parser is given to
// locate a syntax error: goccy/go-yaml allocates 200-550 bytes per byte
// of input and holds them all (a 200 KB file of nested flow lists: 106 MB
// and 143 MB resident).
const syntaxWindow = 64 << 10

// syntaxErrorAt locates a YAML syntax error with a second parser that
// gives columns (CUE's decoder reports the line only); ok is false when
// that parser finds no syntax error, or when the documents around line
// (the decoder's line of the error, 0 if unknown: the whole file), the one
// holding it and the one before, are larger than syntaxWindow.
func syntaxErrorAt(src []byte, line int) (errLine, col int, msg string, ok bool) {
	start, end, first := documentsAround(src, line)
	if end-start > syntaxWindow {
		return 0, 0, "", false
	}
	_, err := goccyparser.ParseBytes(src[start:end], 0)
	var se *goccyyaml.SyntaxError
	if !errors.As(err, &se) || se.Token == nil || se.Token.Position == nil {
		return 0, 0, "", false
	}
	return first - 1 + se.Token.Position.Line, se.Token.Position.Column, se.Message, true
}

// documentsAround is the byte range of src from the start of the document
// before the one holding line to the end of the one holding line, and the
// line the range starts on. Documents are split at the lines that start
// with a document marker (--- or ...), which YAML forbids inside any
// document's content; the document before is included because a decoder
// reports an unclosed collection or quote at the next marker. Line 0 is
// the whole of src.
func documentsAround(src []byte, line int) (start, end, first int) {
	if line <= 0 {
		return 0, len(src), 1
	}
	// starts holds the byte offset and line of the last two marker lines
	// at or before line (the file's start counts as one).
	type mark struct{ off, line int }
	prev, cur := mark{0, 1}, mark{0, 1}
	off := 0
	for n := 1; off < len(src); n++ {
		next := len(src)
		if i := bytes.IndexByte(src[off:], '\n'); i >= 0 {
			next = off + i + 1
		}
		if n > 1 && isDocMarker(src[off:next]) {
			if n > line {
				return prev.off, off, prev.line
			}
			prev, cur = cur, mark{off, n}
		}
		off = next
	}
	return prev.off, len(src), prev.line
}

// isDocMarker reports a line that starts with --- or ... followed by a
// space, a tab or the line's end.
func isDocMarker(l []byte) bool {
	if len(l) < 3 || string(l[:3]) != "---" && string(l[:3]) != "..." {
		return false
	}
	return len(l) == 3 || l[3] == ' ' || l[3] == '\t' || l[3] == '\n' || l[3] == '\r'
}

// yamlErrPos is the line and column of a YAML syntax error: its CUE
// position, else the line the decoder's message names (column 0).
func yamlErrPos(err error) (line, col int) {
	for _, e := range cueerrors.Errors(err) {
		if p := e.Position(); p.IsValid() {
			return p.Line(), p.Column()
		}
	}
	if m := yamlErrAt.FindStringSubmatch(yamlErrMsgRaw(err)); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n, 0
	}
	return 0, 0
}

func yamlErrMsgRaw(err error) string { return err.Error() }

// yamlErrMsg is the decoder's message without its own "file:line: ".
func yamlErrMsg(err error) string {
	msg := yamlErrMsgRaw(err)
	if loc := yamlErrAt.FindStringIndex(msg); loc != nil {
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
