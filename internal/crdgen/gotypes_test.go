package crdgen_test

import (
	"reflect"
	"sort"
	"strings"
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/modelsphere/autoconfig/internal/crdgen"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TestGoTypesMatchCRD: the Go types (schema/v1alpha1) and the CRD
// generated from CUE have the same fields with the same types at every
// level of spec, and every field the CRD requires is always encoded by Go
// (no omitempty), so a typed client never sends an object the API server
// refuses for a missing field.
func TestGoTypesMatchCRD(t *testing.T) {
	res, err := crdgen.Generate()
	if err != nil {
		t.Fatal(err)
	}
	top := res.CRD.Spec.Versions[0].Schema.OpenAPIV3Schema
	compareType(t, "spec", reflect.TypeOf(v1alpha1.Spec{}), top.Properties["spec"])
}

type goField struct {
	typ       reflect.Type
	omitempty bool
}

// jsonFields lists a struct's JSON fields, flattening inlined structs.
func jsonFields(t reflect.Type) map[string]goField {
	out := map[string]goField{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && (name == "" || strings.Contains(opts, "inline")) {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = goField{typ: f.Type, omitempty: strings.Contains(opts, "omitempty")}
	}
	return out
}

func compareType(t *testing.T, path string, gt reflect.Type, s apiextv1.JSONSchemaProps) {
	t.Helper()
	for gt.Kind() == reflect.Pointer {
		gt = gt.Elem()
	}
	var want string
	switch gt.Kind() {
	case reflect.String:
		want = "string"
	case reflect.Int, reflect.Int32, reflect.Int64:
		want = "integer"
	case reflect.Bool:
		want = "boolean"
	case reflect.Struct, reflect.Map:
		want = "object"
	case reflect.Slice:
		want = "array"
	}
	if s.Type != want {
		t.Errorf("%s: CRD type %q, Go %s (%q)", path, s.Type, gt, want)
		return
	}
	switch gt.Kind() {
	case reflect.Slice:
		compareType(t, path+"[]", gt.Elem(), *s.Items.Schema)
	case reflect.Map:
		if s.AdditionalProperties == nil || s.AdditionalProperties.Schema == nil {
			t.Errorf("%s: Go map, CRD object without additionalProperties", path)
			return
		}
		compareType(t, path+"[*]", gt.Elem(), *s.AdditionalProperties.Schema)
	case reflect.Struct:
		gf := jsonFields(gt)
		var names []string
		for n := range gf {
			names = append(names, n)
		}
		for n := range s.Properties {
			if _, ok := gf[n]; !ok {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		for _, n := range names {
			g, inGo := gf[n]
			p, inCRD := s.Properties[n]
			switch {
			case !inGo:
				t.Errorf("%s.%s: in the CRD (from CUE) but not in the Go types", path, n)
			case !inCRD:
				t.Errorf("%s.%s: in the Go types but not in the CRD (from CUE)", path, n)
			default:
				compareType(t, path+"."+n, g.typ, p)
			}
		}
		for _, r := range s.Required {
			if g, ok := gf[r]; ok && g.omitempty {
				t.Errorf("%s.%s: required by the CRD but omitempty in Go", path, r)
			}
		}
	}
}
