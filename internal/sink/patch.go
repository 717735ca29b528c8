package sink

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/go-openapi/jsonpointer"
	"k8s.io/apimachinery/pkg/types"
)

// op is one RFC 6902 JSON patch operation.
type op struct {
	Op    string  `json:"op"`
	Path  string  `json:"path"`
	Value *string `json:"value,omitempty"`
}

// keyPatch builds a JSON patch that changes only the given data keys, each
// guarded by a test of the value it was rendered from: a per-key
// compare-and-swap. Routes sharing a ConfigMap never conflict with each
// other (their keys differ), while a concurrent change of the same key
// (the CART chart rewriting config.yaml's base) fails the test and is
// re-rendered from the fresh content. changed maps key → new value (nil =
// remove); current is the data the values were rendered from.
//
// A key that was absent cannot be tested (JSON patch cannot test absence):
// when the patch adds one, it tests the ConfigMap's resourceVersion
// instead, so two writers claiming one new key cannot both add it (the
// second re-reads, and its guard sees the first one's mark), and a stale
// read cannot add a key someone else has just added. When the ConfigMap
// has no data at all, ok is false: the caller falls back to a
// resourceVersion-guarded merge patch (creating /data must not race
// another writer creating it).
func keyPatch(resourceVersion string, current map[string]string, changed map[string]*string) (patch []byte, ok bool, err error) {
	if current == nil {
		return nil, false, nil
	}
	keys := make([]string, 0, len(changed))
	for k := range changed {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var ops []op
	for _, k := range keys {
		if _, had := current[k]; !had && changed[k] != nil {
			rv := resourceVersion
			ops = append(ops, op{Op: "test", Path: "/metadata/resourceVersion", Value: &rv})
			break
		}
	}
	for _, k := range keys {
		path := "/data/" + jsonpointer.Escape(k) // RFC 6901: ~ → ~0, / → ~1
		cur, had := current[k]
		if had {
			ops = append(ops, op{Op: "test", Path: path, Value: &cur})
		}
		switch v := changed[k]; {
		case v == nil && had:
			ops = append(ops, op{Op: "remove", Path: path})
		case v != nil:
			ops = append(ops, op{Op: "add", Path: path, Value: v}) // add replaces a member
		}
	}
	b, err := json.Marshal(ops)
	if err != nil {
		return nil, false, fmt.Errorf("encode patch: %w", err)
	}
	return b, true, nil
}

// mergePatch builds a JSON merge patch that sets (non-nil) or removes (nil)
// data keys with resourceVersion as a precondition (409 Conflict when the
// ConfigMap changed since it was read).
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

var (
	jsonPatch      = types.JSONPatchType
	mergePatchType = types.MergePatchType
)
