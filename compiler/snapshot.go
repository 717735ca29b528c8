package compiler

import (
	"fmt"

	"sigs.k8s.io/yaml"
)

// ParseSnapshot reads a snapshot from YAML or JSON in the documented format
// (docs/outputs.md): the fields of Snapshot under their JSON names.
// Unknown fields are errors, so a typo cannot silently drop endpoints.
func ParseSnapshot(data []byte) (Snapshot, error) {
	var s Snapshot
	if err := yaml.UnmarshalStrict(data, &s); err != nil {
		return Snapshot{}, fmt.Errorf("parse snapshot: %w", err)
	}
	return s, nil
}
