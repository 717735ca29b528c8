package charttest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/openapi"
)

// TestStatusIsExplained: the API server publishes the ModelRoute's status
// (and the spec's enums and defaults)
// fields with types and descriptions (what `kubectl explain
// modelroute.status.conditions` prints), not an opaque object.
func TestStatusIsExplained(t *testing.T) {
	dc, err := discovery.NewDiscoveryClientForConfig(testCfg)
	must(t, err)
	// The API server publishes a CRD's OpenAPI a moment after it is
	// established.
	var gv openapi.GroupVersion
	deadline := time.Now().Add(time.Minute)
	for gv == nil {
		paths, err := dc.OpenAPIV3().Paths()
		must(t, err)
		gv = paths["apis/routing.modelsphere.dev/v1alpha1"]
		if gv == nil && time.Now().After(deadline) {
			t.Fatalf("no OpenAPI v3 document for routing.modelsphere.dev/v1alpha1 in %d paths", len(paths))
		}
		time.Sleep(200 * time.Millisecond) // polling the API server
	}
	b, err := gv.Schema("application/json")
	must(t, err)
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	must(t, json.Unmarshal(b, &doc))
	var status, spec json.RawMessage
	for name, s := range doc.Components.Schemas {
		if strings.HasSuffix(name, ".ModelRoute") {
			status, spec = s.Properties["status"], s.Properties["spec"]
		}
	}
	// Enums and constant defaults of the CUE schema are in the OpenAPI
	// schema too (kubectl explain lists them), not only in CEL rules.
	var sp struct {
		Properties map[string]struct {
			Enum    []any `json:"enum"`
			Default any   `json:"default"`
		} `json:"properties"`
	}
	must(t, json.Unmarshal(spec, &sp))
	if mt := sp.Properties["modelType"]; len(mt.Enum) != 2 || mt.Default != "llm" {
		t.Errorf("spec.modelType: enum %v, default %v; want [llm video] and llm", mt.Enum, mt.Default)
	}
	if fm := sp.Properties["failureMode"]; len(fm.Enum) != 2 {
		t.Errorf("spec.failureMode: enum %v", fm.Enum)
	}
	var st struct {
		Description string `json:"description"`
		Properties  map[string]struct {
			Type        string `json:"type"`
			Description string `json:"description"`
			Items       struct {
				Properties map[string]struct {
					Type        string `json:"type"`
					Description string `json:"description"`
				} `json:"properties"`
			} `json:"items"`
		} `json:"properties"`
	}
	must(t, json.Unmarshal(status, &st))
	cond := st.Properties["conditions"]
	if cond.Type != "array" || !strings.Contains(cond.Description, "Applied") {
		t.Errorf("status.conditions is %q: %q", cond.Type, cond.Description)
	}
	for _, f := range []string{"type", "status", "reason", "message", "lastTransitionTime"} {
		if cond.Items.Properties[f].Description == "" {
			t.Errorf("status.conditions[].%s has no description", f)
		}
	}
	for _, f := range []string{"backends", "cartPeers", "outputs", "consumers", "synced", "observedGeneration"} {
		if p := st.Properties[f]; p.Type == "" || p.Description == "" {
			t.Errorf("status.%s: type %q, description %q", f, p.Type, p.Description)
		}
	}
}
