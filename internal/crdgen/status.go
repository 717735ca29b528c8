package crdgen

// This file: the status schema. The spec's schema comes from the CUE
// schema; the status is written by the controller only, so its schema
// comes from the Go types (schema/v1alpha1.Status), with their doc comments
// as descriptions, so `kubectl explain modelroute.status.conditions` says
// what each field means. No validation beyond types: the controller is the
// only writer. Unknown status fields are preserved, as they were before.

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// statusSchema is the schema of v1alpha1.Status.
func statusSchema() (apiextv1.JSONSchemaProps, error) {
	f, err := parser.ParseFile(token.NewFileSet(), "types.go", v1alpha1.TypesSource, parser.ParseComments)
	if err != nil {
		return apiextv1.JSONSchemaProps{}, fmt.Errorf("parse v1alpha1 types: %w", err)
	}
	structs := map[string]*ast.TypeSpec{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, s := range g.Specs {
			ts, ok := s.(*ast.TypeSpec)
			if !ok {
				continue
			}
			if ts.Doc == nil && len(g.Specs) == 1 {
				ts.Doc = g.Doc
			}
			structs[ts.Name.Name] = ts
		}
	}
	g := statusGen{structs: structs}
	s, err := g.named("Status", "status")
	if err != nil {
		return s, err
	}
	s.Description = "What the controller observed: backends and CART peers written, conditions, the keys the route holds, and which consumer pods serve its current output."
	// Fields an earlier controller wrote (status.backendEndpoints) and a
	// status given on create stay accepted, as before the status was
	// typed: the typed fields are documented and checked, others kept.
	keep := true
	s.XPreserveUnknownFields = &keep
	return s, nil
}

type statusGen struct{ structs map[string]*ast.TypeSpec }

func (g statusGen) named(name, path string) (apiextv1.JSONSchemaProps, error) {
	ts, ok := g.structs[name]
	if !ok {
		return apiextv1.JSONSchemaProps{}, fmt.Errorf("%s: type %s is not in v1alpha1/types.go", path, name)
	}
	st, ok := ts.Type.(*ast.StructType)
	if !ok {
		return apiextv1.JSONSchemaProps{}, fmt.Errorf("%s: %s is not a struct", path, name)
	}
	out := apiextv1.JSONSchemaProps{Type: "object", Description: doc(ts.Doc), Properties: map[string]apiextv1.JSONSchemaProps{}}
	for _, fld := range st.Fields.List {
		if fld.Tag == nil || len(fld.Names) != 1 {
			return out, fmt.Errorf("%s: field without a json tag or with several names", path)
		}
		tag := reflect.StructTag(strings.Trim(fld.Tag.Value, "`")).Get("json")
		jname, _, _ := strings.Cut(tag, ",")
		if jname == "" || jname == "-" {
			return out, fmt.Errorf("%s.%s: no json name", path, fld.Names[0].Name)
		}
		p, err := g.expr(fld.Type, path+"."+jname)
		if err != nil {
			return out, err
		}
		if d := doc(fld.Doc); d != "" {
			p.Description = d
		}
		out.Properties[jname] = p
	}
	return out, nil
}

func (g statusGen) expr(e ast.Expr, path string) (apiextv1.JSONSchemaProps, error) {
	switch t := e.(type) {
	case *ast.StarExpr:
		return g.expr(t.X, path)
	case *ast.ArrayType:
		item, err := g.expr(t.Elt, path+"[]")
		if err != nil {
			return item, err
		}
		out := apiextv1.JSONSchemaProps{Type: "array", Items: &apiextv1.JSONSchemaPropsOrArray{Schema: &item}}
		if sel, ok := t.Elt.(*ast.SelectorExpr); ok && sel.Sel.Name == "Condition" {
			mapType := "map"
			out.XListType = &mapType
			out.XListMapKeys = []string{"type"}
		}
		return out, nil
	case *ast.Ident:
		switch t.Name {
		case "string":
			return apiextv1.JSONSchemaProps{Type: "string"}, nil
		case "bool":
			return apiextv1.JSONSchemaProps{Type: "boolean"}, nil
		case "int32", "int64":
			return apiextv1.JSONSchemaProps{Type: "integer", Format: t.Name}, nil
		}
		return g.named(t.Name, path)
	case *ast.SelectorExpr:
		switch t.Sel.Name {
		case "Time":
			return apiextv1.JSONSchemaProps{Type: "string", Format: "date-time"}, nil
		case "Condition":
			return conditionSchema(), nil
		}
	}
	return apiextv1.JSONSchemaProps{}, fmt.Errorf("%s: type %T has no schema here; add it to crdgen/status.go", path, e)
}

// conditionSchema is metav1.Condition's schema, as Kubernetes documents it.
func conditionSchema() apiextv1.JSONSchemaProps {
	str := func(d string) apiextv1.JSONSchemaProps {
		return apiextv1.JSONSchemaProps{Type: "string", Description: d}
	}
	return apiextv1.JSONSchemaProps{
		Type:        "object",
		Description: "One aspect of the route's state (Ready, Reconciling, Stalled, Degraded, Applied).",
		Required:    []string{"type", "status", "lastTransitionTime", "reason", "message"},
		Properties: map[string]apiextv1.JSONSchemaProps{
			"type":               str("Ready: the route's outputs hold its current render; Applied: every consumer pod serves it; Reconciling, Stalled, Degraded: docs/controller.md."),
			"status":             {Type: "string", Description: "True, False or Unknown.", Enum: []apiextv1.JSON{{Raw: []byte(`"True"`)}, {Raw: []byte(`"False"`)}, {Raw: []byte(`"Unknown"`)}}},
			"observedGeneration": {Type: "integer", Format: "int64", Description: "The route generation the condition was set for."},
			"lastTransitionTime": {Type: "string", Format: "date-time", Description: "When the status last changed."},
			"reason":             str("A CamelCase reason (e.g. NoBackends, OutputConflict); the table in docs/controller.md says what to do for each."),
			"message":            str("What is wrong (or right), in words, with the fields and objects involved."),
		},
	}
}

// doc is a comment group as one line of text.
func doc(c *ast.CommentGroup) string {
	if c == nil {
		return ""
	}
	return strings.Join(strings.Fields(c.Text()), " ")
}
