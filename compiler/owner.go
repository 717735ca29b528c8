package compiler

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/modelsphere/autoconfig/internal/peers"

	"gopkg.in/yaml.v3"
)

// Ownership marks. Every key autoconfig writes names the ModelRoute whose
// render it holds, in one line a program can read back (Owner):
//
//	# <key>: written by autoconfig from ModelRoute <namespace>/<name>; do not edit.
//
// The route file and the monitor file start with it. The CART config.yaml
// belongs to the CART chart and autoconfig rewrites only its workers list,
// so there the mark is the last line of the comment above the workers key
// (with "workers" as <key>): a YAML comment, which CART's loader ignores and
// the renderer keeps when it rewrites the file.

const (
	markPrefix = ": written by autoconfig from ModelRoute "
	markSuffix = "; do not edit."
	// cartMarkKey is the <key> of the CART config.yaml's mark.
	cartMarkKey = "workers"
)

// OwnerRef is how a mark names a route: namespace/name, or the name alone
// when the route has no namespace (offline compiles).
func OwnerRef(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// ownerMark is the mark line (without '\n') of key for the route ref.
func ownerMark(key, ref string) string {
	return "# " + key + markPrefix + ref + markSuffix
}

// parseMark returns the route ref of a mark line for key.
func parseMark(line, key string) (string, bool) {
	rest, ok := strings.CutPrefix(line, "# "+key+markPrefix)
	if !ok {
		return "", false
	}
	ref, ok := strings.CutSuffix(rest, markSuffix)
	if !ok || ref == "" || strings.ContainsAny(ref, " \t") {
		return "", false
	}
	return ref, true
}

// Content is what an existing ConfigMap value says about who may write it.
type Content struct {
	// Owner is the route ref in the value's ownership mark ("" = none).
	Owner string
	// Free is true when the value may be claimed by any route without
	// taking anything over: only the CART config.yaml can be free, when it
	// has a top-level workers key with an empty list (the CART chart's
	// placeholder) and no mark.
	Free bool
	// Workers is, for a CART config.yaml, the URLs of its workers list.
	Workers []string
}

// ReadContent reads the ownership of the value of key (as OutputKeys names
// it). A value without a mark is hand-written (or written by another tool),
// unless Free. Unparsable CART YAML is neither owned nor free.
func ReadContent(key string, value []byte) Content {
	if peers.IsKey(key) {
		// A peers table is JSON: its owner field is the mark. A value
		// that is no table is hand-written.
		var t struct {
			Owner string `json:"owner"`
		}
		if json.Unmarshal(value, &t) != nil || strings.ContainsAny(t.Owner, " \t") {
			return Content{}
		}
		return Content{Owner: t.Owner}
	}
	if key != CartKey {
		first, _, _ := bytes.Cut(value, []byte("\n"))
		ref, _ := parseMark(string(first), key)
		return Content{Owner: ref}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(value, &doc); err != nil || doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return Content{}
	}
	root := doc.Content[0]
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Value != cartMarkKey {
			continue
		}
		c := Content{Owner: cartOwner(k.HeadComment)}
		switch {
		case v.Kind == yaml.SequenceNode:
			for _, w := range v.Content {
				c.Workers = append(c.Workers, workerURL(w))
			}
		case v.Kind == yaml.ScalarNode && v.Tag == "!!null":
		default:
			return Content{Owner: c.Owner} // workers is not a list: not CART's shape
		}
		c.Free = c.Owner == "" && len(c.Workers) == 0
		return c
	}
	return Content{}
}

// workerURL is the url of one workers entry ("" when it has none).
func workerURL(n *yaml.Node) string {
	if n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "url" {
			return n.Content[i+1].Value
		}
	}
	return ""
}

// cartOwner finds the mark among the comment lines above workers.
func cartOwner(comment string) string {
	for _, line := range strings.Split(comment, "\n") {
		if ref, ok := parseMark(strings.TrimSpace(line), cartMarkKey); ok {
			return ref
		}
	}
	return ""
}

// withCartMark returns the comment above workers with every earlier mark
// removed and ref's mark as its last line.
func withCartMark(comment, ref string) string {
	var lines []string
	for _, line := range strings.Split(comment, "\n") {
		if _, ok := parseMark(strings.TrimSpace(line), cartMarkKey); ok || line == "" {
			continue
		}
		lines = append(lines, line)
	}
	return strings.Join(append(lines, ownerMark(cartMarkKey, ref)), "\n")
}
