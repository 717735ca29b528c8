package yamlscan

import (
	"fmt"
	"strconv"

	"gopkg.in/yaml.v3"
)

// Duplicate is a mapping key that repeats an earlier key of its mapping:
// YAML forbids it, and the parsers behind autoconfig keep one of the two
// values without a word (or, in CUE, unify them).
type Duplicate struct {
	// Key is the repeated key; Path is the repeat's field path
	// (spec.nginx.peers.0.use).
	Key, Path string
	// Line and Column locate the repeat, FirstLine and FirstColumn the
	// earlier key.
	Line, Column           int
	FirstLine, FirstColumn int
}

// Message says what is wrong and what to do.
func (d Duplicate) Message() string {
	first := fmt.Sprintf("line %d", d.FirstLine)
	if d.FirstLine == d.Line {
		first += fmt.Sprintf(" (column %d)", d.FirstColumn)
	}
	return fmt.Sprintf("key %q repeats the one on %s: a mapping holds each key once; delete one of them", d.Key, first)
}

// Duplicates lists the repeated keys of the mappings in n, in document
// order. Keys are compared by their text (1 and "1" are one field in
// JSON and CUE); a merge key (<<) and keys that are collections are not
// compared, and aliases are not followed.
func Duplicates(n *yaml.Node) []Duplicate {
	var out []Duplicate
	duplicates(n, "", &out)
	return out
}

// joinPath is the field path of key k under path ("" = the document).
func joinPath(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

func duplicates(n *yaml.Node, path string, out *[]Duplicate) {
	join := func(k string) string { return joinPath(path, k) }
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			duplicates(c, path, out)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			duplicates(c, join(strconv.Itoa(i)), out)
		}
	case yaml.MappingNode:
		seen := map[string]*yaml.Node{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
				continue
			}
			if first, ok := seen[k.Value]; ok {
				*out = append(*out, Duplicate{Key: k.Value, Path: join(k.Value), Line: k.Line, Column: k.Column, FirstLine: first.Line, FirstColumn: first.Column})
			} else {
				seen[k.Value] = k
			}
			duplicates(v, join(k.Value), out)
		}
	}
}
