package crdgen_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"k8s.io/kube-openapi/pkg/spec3"

	"github.com/modelsphere/autoconfig/internal/crdgen"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

func compileJSONSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	b, err := crdgen.JSONSchema()
	if err != nil {
		t.Fatal(err)
	}
	// The committed export is this one (make generate; make verify checks).
	committed, err := os.ReadFile(filepath.Join(testbin.Root(t), "deploy", "schemas", crdgen.JSONSchemaFile))
	if err != nil || !bytes.Equal(committed, b) {
		t.Fatalf("deploy/schemas/%s is not the generated schema (run make generate): %v", crdgen.JSONSchemaFile, err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("modelroute.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("modelroute.json")
	if err != nil {
		t.Fatalf("the JSON Schema does not compile: %v", err)
	}
	return s
}

func asJSONValue(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestJSONSchemaAcceptsWhatCUEAccepts: an editor or kubeconform using the
// exported JSON Schema never flags a route the schema accepts (every
// valid document of the corpus and the samples passes), and it catches
// what the CRD's structural schema holds: unknown fields, types, required
// fields, apiVersion/kind, the name. The rules (bounds, enums, rules
// between fields) are CEL in the CRD and CUE in vet; how many invalid
// documents it catches is logged.
func TestJSONSchemaAcceptsWhatCUEAccepts(t *testing.T) {
	s := compileJSONSchema(t)
	valid, caught, invalid := 0, 0, 0
	for _, d := range loadCorpus(t) {
		if d.obj == nil {
			continue
		}
		err := s.Validate(asJSONValue(t, d.obj))
		if d.cueErr == nil {
			valid++
			if err != nil {
				t.Errorf("%s: accepted by the CUE schema, refused by the JSON Schema: %v", d.id, err)
			}
			continue
		}
		invalid++
		if err != nil {
			caught++
		}
	}
	if valid < 10 {
		t.Fatalf("only %d valid documents in the corpus", valid)
	}
	t.Logf("JSON Schema: %d valid documents accepted; %d of %d invalid ones caught (the rest break rules between fields)", valid, caught, invalid)

	base := func() map[string]any {
		return map[string]any{
			"apiVersion": "routing.modelsphere.dev/v1alpha1", "kind": "ModelRoute",
			"metadata": map[string]any{"name": "qwen"},
			"spec": map[string]any{
				"discovery": map[string]any{"service": "qwen"},
				"nginx":     map[string]any{"outputConfigMap": "conf", "peers": []any{map[string]any{"use": "backend"}}},
			},
		}
	}
	if err := s.Validate(asJSONValue(t, base())); err != nil {
		t.Fatalf("a minimal route: %v", err)
	}
	for name, mutate := range map[string]func(m map[string]any){
		"unknown field": func(m map[string]any) { m["spec"].(map[string]any)["nginx"].(map[string]any)["peerz"] = []any{} },
		"field type":    func(m map[string]any) { m["spec"].(map[string]any)["discovery"].(map[string]any)["port"] = "8000" },
		"kind":          func(m map[string]any) { m["kind"] = "Deployment" },
		"metadata.name": func(m map[string]any) { m["metadata"] = map[string]any{"name": "Bad_Name"} },
	} {
		m := base()
		mutate(m)
		if err := s.Validate(asJSONValue(t, m)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestOpenAPIExport: the committed OpenAPI document is the generated one,
// it parses as OpenAPI 3 (kube-openapi's spec3, what the API server
// serves), and its one schema is the CRD's.
func TestOpenAPIExport(t *testing.T) {
	b, err := crdgen.OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join(testbin.Root(t), "deploy", "schemas", crdgen.OpenAPIFile))
	if err != nil || !bytes.Equal(committed, b) {
		t.Fatalf("deploy/schemas/%s is not the generated document (run make generate): %v", crdgen.OpenAPIFile, err)
	}
	var doc spec3.OpenAPI
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("not OpenAPI 3: %v", err)
	}
	if doc.Version != "3.0.3" || doc.Components == nil || len(doc.Components.Schemas) != 1 {
		t.Fatalf("openapi %q, components %+v", doc.Version, doc.Components)
	}
	r, err := crdgen.Generate()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(r.CRD.Spec.Versions[0].Schema.OpenAPIV3Schema)
	for name, s := range doc.Components.Schemas {
		got, _ := json.Marshal(s)
		var a, b any
		_ = json.Unmarshal(got, &a)
		_ = json.Unmarshal(want, &b)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("schema %s differs from the CRD's", name)
		}
		if s.Properties["spec"].Properties["nginx"].Properties["peers"].Type[0] != "array" {
			t.Errorf("schema %s: spec.nginx.peers is not an array", name)
		}
	}
}
