package sink

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
)

const typesMergePatch = types.MergePatchType

// mergePatch builds a JSON merge patch that sets (non-nil) or removes (nil)
// data keys and carries resourceVersion as a precondition: the API server
// answers 409 Conflict when the ConfigMap changed since it was read. Only
// the changed keys travel, so other routes' keys are never rewritten.
func mergePatch(resourceVersion string, data map[string]*string) ([]byte, error) {
	p := struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Data map[string]*string `json:"data"`
	}{Data: data}
	p.Metadata.ResourceVersion = resourceVersion
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode patch: %w", err)
	}
	return b, nil
}
