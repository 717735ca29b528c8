package yamlscan

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// Counts bounds the size of one parsed document: how many entries one
// sequence or mapping may hold and how many nodes the whole document may
// have. They are for a schema evaluator whose time and memory grow with
// every value it is given (CUE spends 0.2-0.5 ms and 20-50 KB per list
// entry of a route's peers), not for the parser: a parsed file is bounded
// by MaxBytes already.
type Counts struct {
	// Entries is the limit of one sequence's items or one mapping's keys.
	Entries int
	// Nodes is the limit of the document's nodes: every scalar, key,
	// sequence and mapping.
	Nodes int
}

// TooMany: a document has a collection of more than Counts.Entries
// entries or more than Counts.Nodes nodes; Line and Column locate the
// first entry or node past the limit.
const TooMany Kind = TooDeep + 1

// Bounds refuses a document n that has more entries in one collection or
// more nodes than c allows; doc words the message. An alias counts as the
// nodes it repeats (a schema evaluator is given the expanded document: 999
// aliases of one peer of 46 fields, a 3.5 KB file, were 46,000 values for
// CUE, 9 s and 470 MB), so the walk follows aliases and stops at the
// limit. Nil or an *Error.
func Bounds(n *yaml.Node, c Counts, doc Doc) error {
	_, err := Count(n, c, doc)
	return err
}

// Count is Bounds that also returns the nodes of n it counted (all of
// them when the error is nil).
func Count(n *yaml.Node, c Counts, doc Doc) (int, error) {
	b := bounder{c: c, doc: doc}
	b.walk(n, "")
	if b.err != nil {
		return b.nodes, b.err
	}
	return b.nodes, nil
}

type bounder struct {
	c     Counts
	doc   Doc
	nodes int
	err   *Error
	// alias is the outermost alias being expanded: a limit passed inside
	// its expansion is reported there.
	alias *yaml.Node
}

func (b *bounder) walk(n *yaml.Node, path string) {
	if b.err != nil {
		return
	}
	if b.nodes++; b.nodes > b.c.Nodes {
		at, aliases := n, ""
		if b.alias != nil {
			at, aliases = b.alias, ", counting what its aliases repeat"
		}
		b.err = &Error{Kind: TooMany, Line: at.Line, Column: at.Column, Message: fmt.Sprintf(
			"the document has more than %d values%s, the limit for one document (it bounds %s; %s has a few hundred): is this file %s?",
			b.c.Nodes, aliases, b.doc.work(), b.doc.Name, b.doc.Name)}
		return
	}
	switch n.Kind {
	case yaml.AliasNode:
		if n.Alias == nil {
			return
		}
		b.nodes-- // the alias stands for its anchor's node
		if b.alias == nil {
			b.alias = n
			defer func() { b.alias = nil }()
		}
		b.walk(n.Alias, path)
	case yaml.DocumentNode:
		for _, c := range n.Content {
			b.walk(c, path)
		}
	case yaml.SequenceNode:
		if len(n.Content) > b.c.Entries {
			at := n.Content[b.c.Entries]
			b.err = &Error{Kind: TooMany, Line: at.Line, Column: at.Column, Message: fmt.Sprintf(
				"%s: the list has %d entries, more than %d, the limit for one list (it bounds %s; %s needs a handful): shorten it",
				where(path), len(n.Content), b.c.Entries, b.doc.work(), b.doc.Name)}
			return
		}
		for i, c := range n.Content {
			b.walk(c, joinPath(path, fmt.Sprint(i)))
		}
	case yaml.MappingNode:
		if len(n.Content)/2 > b.c.Entries {
			at := n.Content[2*b.c.Entries]
			b.err = &Error{Kind: TooMany, Line: at.Line, Column: at.Column, Message: fmt.Sprintf(
				"%s: the mapping has %d keys, more than %d, the limit for one mapping (it bounds %s; %s needs a few dozen): shorten it",
				where(path), len(n.Content)/2, b.c.Entries, b.doc.work(), b.doc.Name)}
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			b.nodes++
			b.walk(n.Content[i+1], joinPath(path, k.Value))
		}
	}
}

// work is what Counts bound for doc: Doc.Work, else the schema's work.
func (d Doc) work() string {
	if d.Work != "" {
		return d.Work
	}
	return "the schema's work"
}

func where(path string) string {
	if path == "" {
		return "the document"
	}
	return path
}
