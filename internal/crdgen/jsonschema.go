package crdgen

// This file: the ModelRoute as a JSON Schema, for editors (the YAML
// language server's schema mapping) and kubeconform. It is the CRD's
// OpenAPI v3 schema — generated from the CUE schema — with apiVersion and
// kind pinned and the Kubernetes-only extensions turned into JSON Schema.
// The CEL rules (x-kubernetes-validations) cannot be expressed there:
// `autoconfig vet` checks them.

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// JSONSchemaFile is the committed export, in deploy/schemas.
const JSONSchemaFile = "modelroute-v1alpha1.schema.json"

// JSONSchema renders the ModelRoute JSON Schema (draft 2020-12).
func JSONSchema() ([]byte, error) {
	r, err := Generate()
	if err != nil {
		return nil, err
	}
	if len(r.CRD.Spec.Versions) != 1 || r.CRD.Spec.Versions[0].Schema == nil {
		return nil, fmt.Errorf("the CRD has no single version schema")
	}
	b, err := json.Marshal(r.CRD.Spec.Versions[0].Schema.OpenAPIV3Schema)
	if err != nil {
		return nil, err
	}
	var s map[string]any
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	toJSONSchema(s)
	props, _ := s["properties"].(map[string]any)
	if props == nil {
		return nil, fmt.Errorf("the CRD schema has no properties")
	}
	// metadata is Kubernetes' ObjectMeta (the CRD leaves it to the API
	// server): name is what a route needs.
	props["metadata"] = map[string]any{
		"type":     "object",
		"required": []any{"name"},
		"properties": map[string]any{
			"name":      map[string]any{"type": "string", "pattern": `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`, "maxLength": 253},
			"namespace": map[string]any{"type": "string", "pattern": `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`, "maxLength": 63},
		},
	}
	props["apiVersion"] = map[string]any{"type": "string", "const": v1alpha1.APIVersion}
	props["kind"] = map[string]any{"type": "string", "const": v1alpha1.Kind}
	s["required"] = mergeRequired(s["required"], "apiVersion", "kind", "metadata", "spec")
	s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	s["$id"] = "https://" + v1alpha1.Group + "/schemas/" + JSONSchemaFile
	s["title"] = v1alpha1.Kind + " (" + v1alpha1.APIVersion + ")"
	s["description"] = "Generated from the CUE schema (autoconfig crd --json-schema). Field types, required fields and unknown fields are checked here; the rules (bounds, enums, rules between fields: CEL in the CRD) only by autoconfig vet and the API server."
	out, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// toJSONSchema rewrites Kubernetes' structural-schema extensions in place:
// x-kubernetes-preserve-unknown-fields allows any property,
// x-kubernetes-int-or-string is a oneOf, nullable adds null; the other
// x-kubernetes-* keys (CEL rules, list types) are dropped.
func toJSONSchema(s map[string]any) {
	if s["x-kubernetes-int-or-string"] == true {
		s["oneOf"] = []any{map[string]any{"type": "integer"}, map[string]any{"type": "string"}}
		delete(s, "type")
	}
	if s["nullable"] == true {
		if t, ok := s["type"].(string); ok {
			s["type"] = []any{t, "null"}
		}
		delete(s, "nullable")
	}
	if s["x-kubernetes-preserve-unknown-fields"] == true {
		if _, has := s["additionalProperties"]; !has {
			s["additionalProperties"] = true
		}
	} else if t, _ := s["type"].(string); t == "object" && s["properties"] != nil {
		if _, has := s["additionalProperties"]; !has {
			s["additionalProperties"] = false // unknown fields are errors, as the API server prunes and vet rejects them
		}
	}
	for k := range s {
		if strings.HasPrefix(k, "x-kubernetes-") {
			delete(s, k)
		}
	}
	for _, key := range []string{"properties", "patternProperties"} {
		if m, ok := s[key].(map[string]any); ok {
			for _, v := range m {
				if sub, ok := v.(map[string]any); ok {
					toJSONSchema(sub)
				}
			}
		}
	}
	for _, key := range []string{"items", "additionalProperties", "not"} {
		if sub, ok := s[key].(map[string]any); ok {
			toJSONSchema(sub)
		}
	}
	for _, key := range []string{"allOf", "anyOf", "oneOf"} {
		if l, ok := s[key].([]any); ok {
			for _, v := range l {
				if sub, ok := v.(map[string]any); ok {
					toJSONSchema(sub)
				}
			}
		}
	}
}

func mergeRequired(cur any, add ...string) []any {
	var out []any
	seen := map[string]bool{}
	if l, ok := cur.([]any); ok {
		for _, v := range l {
			if s, ok := v.(string); ok && !seen[s] {
				seen[s] = true
				out = append(out, s)
			}
		}
	}
	for _, s := range add {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// OpenAPIFile is the committed OpenAPI export, in deploy/schemas.
const OpenAPIFile = "modelroute-v1alpha1.openapi.json"

// OpenAPI renders an OpenAPI 3.0 document whose components.schemas holds
// the ModelRoute: the CRD's own structural schema (the x-kubernetes-*
// extensions and CEL rules included, as the API server publishes it),
// for API tooling that reads OpenAPI rather than CRDs.
func OpenAPI() ([]byte, error) {
	r, err := Generate()
	if err != nil {
		return nil, err
	}
	if len(r.CRD.Spec.Versions) != 1 || r.CRD.Spec.Versions[0].Schema == nil {
		return nil, fmt.Errorf("the CRD has no single version schema")
	}
	name := strings.ReplaceAll(v1alpha1.Group, ".", "_") + "_" + r.CRD.Spec.Versions[0].Name + "_" + v1alpha1.Kind
	doc := map[string]any{
		"openapi": "3.0.3",
		"info": map[string]any{
			"title":       v1alpha1.Kind + " " + v1alpha1.APIVersion,
			"description": "Generated from the CUE schema (autoconfig crd --openapi): the schema the CRD gives the API server.",
			"version":     r.CRD.Spec.Versions[0].Name,
		},
		"paths": map[string]any{},
		"components": map[string]any{
			"schemas": map[string]any{name: r.CRD.Spec.Versions[0].Schema.OpenAPIV3Schema},
		},
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
