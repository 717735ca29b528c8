package celcheck_test

import (
	"context"
	"strings"
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelsphere/autoconfig/internal/celcheck"
)

func widgetCRD(rule string) *apiextv1.CustomResourceDefinition {
	max := int64(10)
	return &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com"},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: "example.com",
			Names: apiextv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Scope: apiextv1.NamespaceScoped,
			Versions: []apiextv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextv1.JSONSchemaProps{
						"apiVersion": {Type: "string"},
						"kind":       {Type: "string"},
						"metadata":   {Type: "object"},
						"spec": {
							Type: "object",
							Properties: map[string]apiextv1.JSONSchemaProps{
								"a": {Type: "string", MaxLength: &max},
								"b": {Type: "string", MaxLength: &max},
							},
							XValidations: apiextv1.ValidationRules{{Rule: rule, Message: "set a or b"}},
						},
					},
				}},
			}},
		},
	}
}

func widget(spec map[string]any, meta map[string]any) map[string]any {
	return map[string]any{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": meta, "spec": spec}
}

func TestValidate(t *testing.T) {
	v, err := celcheck.New(widgetCRD("has(self.a) || has(self.b)"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name := map[string]any{"name": "w"}
	for _, c := range []struct {
		name string
		obj  map[string]any
		want string // "" = valid
	}{
		{"valid", widget(map[string]any{"a": "x"}, name), ""},
		{"cel rule", widget(map[string]any{}, name), "set a or b"},
		{"unknown spec field", widget(map[string]any{"a": "x", "c": "y"}, name), "spec.c"},
		{"unknown metadata field", widget(map[string]any{"a": "x"}, map[string]any{"name": "w", "colour": "blue"}), "metadata.colour"},
		{"bad name", widget(map[string]any{"a": "x"}, map[string]any{"name": "W"}), "metadata.name"},
		{"generateName", widget(map[string]any{"a": "x"}, map[string]any{"generateName": "w-"}), ""},
		{"null is unset", widget(map[string]any{"a": "x", "b": nil}, name), ""},
		{"too long", widget(map[string]any{"a": strings.Repeat("x", 11)}, name), "spec.a"},
		{"wrong kind", map[string]any{"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": name, "spec": map[string]any{"a": "x"}}, "kind"},
	} {
		errs := v.Validate(ctx, c.obj)
		switch {
		case c.want == "" && len(errs) > 0:
			t.Errorf("%s: unexpected errors: %v", c.name, errs.ToAggregate())
		case c.want != "" && len(errs) == 0:
			t.Errorf("%s: accepted, want an error about %s", c.name, c.want)
		case c.want != "" && !strings.Contains(errs.ToAggregate().Error(), c.want):
			t.Errorf("%s: errors %v do not mention %s", c.name, errs.ToAggregate(), c.want)
		}
	}
}

// TestNewRejectsBadCRDs: the CRD itself is checked as the API server
// checks it on create (CEL compilation here).
func TestNewRejectsBadCRDs(t *testing.T) {
	if _, err := celcheck.New(widgetCRD("self.nosuchfield == 1")); err == nil {
		t.Fatal("a rule over an undeclared field compiled")
	}
	if _, err := celcheck.New(widgetCRD("has(self.a) ||")); err == nil {
		t.Fatal("a syntax error compiled")
	}
}
