package compiler

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/modelsphere/autoconfig/schema/yamlscan"
)

// snapshotDoc words the messages of a snapshot refused before parsing: it
// nests 3 deep (a mapping of lists of endpoints), and 1000 endpoints take
// about 60 KB.
var snapshotDoc = yamlscan.Doc{Name: "an endpoint snapshot", Depth: 4, TooLarge: "is it the snapshot? 4 MiB hold about 70,000 endpoints"}

// SnapshotError lists every problem of a snapshot file, one a line, each
// as file:line:column: field: message.
type SnapshotError struct {
	Problems []string
}

func (e *SnapshotError) Error() string { return strings.Join(e.Problems, "\n") }

// ParseSnapshot reads the snapshot file name (YAML or JSON, one document)
// in the documented format (docs/outputs.md): the fields of Snapshot under
// their JSON names. Unknown fields, repeated keys and values of the wrong
// type are errors at their line, so a typo cannot silently drop endpoints.
// A file larger than yamlscan.MaxBytes or nested deeper than
// yamlscan.MaxDepth is refused before it is parsed. Errors are a
// *SnapshotError.
func ParseSnapshot(name string, data []byte) (Snapshot, error) {
	fail := func(line, col int, format string, args ...any) (Snapshot, error) {
		return Snapshot{}, &SnapshotError{Problems: []string{at(name, line, col) + fmt.Sprintf(format, args...)}}
	}
	if err := yamlscan.Check(data, snapshotDoc); err != nil {
		var e *yamlscan.Error
		errors.As(err, &e)
		return fail(e.Line, e.Column, "%s", e.Message)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
		return Snapshot{}, nil
	} else if err != nil {
		line, msg := yamlErrLine(err)
		return fail(line, 0, "parse yaml: %s", msg)
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		line := next.Line
		if err != nil {
			line, _ = yamlErrLine(err)
		}
		return fail(line, 0, "a snapshot is one YAML document; a second one starts here: remove it")
	}
	d := snapshotDecoder{name: name}
	for _, dup := range yamlscan.Duplicates(&doc) {
		d.problem(dup.Line, dup.Column, dup.Path, "%s", dup.Message())
	}
	if len(d.problems) > 0 {
		return Snapshot{}, &SnapshotError{Problems: d.problems}
	}
	var s Snapshot
	if len(doc.Content) == 1 {
		d.decode(doc.Content[0], reflect.ValueOf(&s).Elem(), "")
	}
	if len(d.problems) > 0 {
		return Snapshot{}, &SnapshotError{Problems: d.problems}
	}
	return s, nil
}

func at(name string, line, col int) string {
	switch {
	case col > 0:
		return fmt.Sprintf("%s:%d:%d: ", name, line, col)
	case line > 0:
		return fmt.Sprintf("%s:%d: ", name, line)
	}
	return name + ": "
}

// yamlErrAt matches the "yaml: line N: " of a yaml.v3 syntax error.
var yamlErrAt = regexp.MustCompile(`^yaml: line (\d+): `)

func yamlErrLine(err error) (int, string) {
	msg := err.Error()
	m := yamlErrAt.FindStringSubmatch(msg)
	if m == nil {
		return 0, strings.TrimPrefix(msg, "yaml: ")
	}
	var line int
	fmt.Sscan(m[1], &line)
	return line, msg[len(m[0]):]
}

// snapshotDecoder decodes a yaml.v3 node tree into Snapshot's types by
// their JSON field names, collecting a located problem for every value it
// cannot take.
type snapshotDecoder struct {
	name     string
	problems []string
}

func (d *snapshotDecoder) problem(line, col int, path, format string, args ...any) {
	if path != "" {
		path += ": "
	}
	d.problems = append(d.problems, at(d.name, line, col)+path+fmt.Sprintf(format, args...))
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// describe names what a node is, for "want X, got Y".
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return fmt.Sprintf("%q", n.Value)
}

// decode decodes n into v. Aliases are followed: Snapshot's types nest
// three deep (fields, lists, endpoints of scalars) and a node of the wrong
// kind is not descended into, so an alias expands to at most one list of
// endpoints and the work stays linear in the file.
func (d *snapshotDecoder) decode(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind == yaml.AliasNode {
		d.decode(n.Alias, v, path)
		return
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return // as in JSON: the field keeps its zero value
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.decode(n, v.Elem(), path)
	case reflect.Struct:
		d.decodeStruct(n, v, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.problem(n.Line, n.Column, path, "want a list, got %s", describe(n))
			return
		}
		v.Set(reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content)))
		for i, c := range n.Content {
			d.decode(c, v.Index(i), join(path, fmt.Sprint(i)))
		}
	case reflect.String:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
			d.problem(n.Line, n.Column, path, "want a string, got %s: quote it if it is one", describe(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		want := "true or false"
		if v.Kind() != reflect.Bool {
			want = "a whole number"
		}
		if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!str" && n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0 {
			d.problem(n.Line, n.Column, path, "want %s, got %s", want, describe(n))
			return
		}
		if err := n.Decode(v.Addr().Interface()); err != nil {
			if n.ShortTag() == "!!int" && v.Kind() != reflect.Bool {
				bits := v.Type().Bits()
				want = fmt.Sprintf("a whole number from %d to %d", -1<<(bits-1), 1<<(bits-1)-1)
			}
			d.problem(n.Line, n.Column, path, "want %s, got %s", want, describe(n))
		}
	default:
		d.problem(n.Line, n.Column, path, "cannot read a value of Go type %s", v.Type())
	}
}

// decodeStruct decodes a mapping into the struct v by its fields' JSON
// names (matched exactly, else ignoring case, as encoding/json does).
func (d *snapshotDecoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.problem(n.Line, n.Column, path, "want a mapping (field: value), got %s", describe(n))
		return
	}
	t := v.Type()
	var names []string
	for i := range t.NumField() {
		names = append(names, jsonName(t.Field(i)))
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		f := -1
		for j, name := range names {
			if name == k.Value {
				f = j
				break
			}
			if f < 0 && strings.EqualFold(name, k.Value) {
				f = j
			}
		}
		if f < 0 {
			d.problem(k.Line, k.Column, join(path, k.Value), "unknown field %q; the fields here are %s", k.Value, strings.Join(names, ", "))
			continue
		}
		d.decode(val, v.Field(f), join(path, names[f]))
	}
}

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if name == "" {
		return f.Name
	}
	return name
}
