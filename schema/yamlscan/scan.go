// Package yamlscan bounds what a YAML parser is given from a user's file.
// Check is a pre-scan of the raw bytes, linear in their length, that
// refuses a file too large, not UTF-8 (or UTF-16 with a byte-order mark)
// or nested deeper than any document autoconfig reads, before a parser
// sees it: goccy/go-yaml, which locates the schema's syntax errors, spends
// time and memory that grow with the square of the nesting (`[[[…]]]`
// 20,000 deep, 40 KB: 3.2 s and 640 MB; 100,000 deep: 161 s and 14.8 GB;
// yaml.v3 answers both with its depth limit in 50 ms), and no parser needs
// to see more than a document autoconfig reads can hold. Duplicates finds
// the mapping keys of a parsed node tree that repeat an earlier key of
// their mapping.
//
// The package uses the standard library and yaml.v3 only: both the schema
// and the compiler read user YAML through it.
package yamlscan

import (
	"bytes"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

const (
	// MaxBytes is the size limit of one file: it bounds the memory and
	// time of parsing it (a ModelRoute is 1-5 KB, an endpoint snapshot of
	// 1000 endpoints about 60 KB; 4 MiB holds a GitOps directory's worth
	// of routes in one multi-document file).
	MaxBytes = 4 << 20
	// MaxDepth is the nesting limit: block collections by indentation
	// plus flow collections ([ and {). A ModelRoute needs fewer than 15
	// levels, an endpoint snapshot 3; 100 leaves room for any hand-written
	// or templated file while the parsers' quadratic cost stays below a
	// millisecond.
	MaxDepth = 100
)

// Error is a file refused before parsing. Line and Column (in characters)
// are 1-based; Column is 0 when only the line is known.
type Error struct {
	Kind         Kind
	Line, Column int
	Message      string
}

// Kind is why a file is refused.
type Kind int

const (
	// TooLarge: larger than MaxBytes; Line is the line of the byte past
	// the limit.
	TooLarge Kind = iota + 1
	// NotUTF8: Line and Column locate the first byte that is not UTF-8.
	NotUTF8
	// TooDeep: Line and Column locate the bracket, key or entry that
	// opens level MaxDepth+1.
	TooDeep
)

func (e *Error) Error() string {
	if e.Column > 0 {
		return fmt.Sprintf("%d:%d: %s", e.Line, e.Column, e.Message)
	}
	return fmt.Sprintf("%d: %s", e.Line, e.Message)
}

// Doc says what a file holds, for the messages of Check.
type Doc struct {
	// Name is the document's kind with its article: "a ModelRoute".
	Name string
	// Depth is the nesting the document needs at most.
	Depth int
	// TooLarge says what to do with a file larger than MaxBytes.
	TooLarge string
	// Work is what Counts bound in the messages of Bounds ("" = the
	// schema's work).
	Work string
}

// Check refuses src when it is larger than MaxBytes, is not UTF-8 (nor
// UTF-16 with a byte-order mark, which YAML allows), or nests deeper than
// MaxDepth; doc words the messages. The scan is conservative: it ignores
// brackets in quoted scalars, block scalars and comments, and counts a
// block level only where one certainly starts, so a valid file is refused
// only when it really is deeper than the limit. Nil or an *Error.
func Check(src []byte, doc Doc) error {
	if len(src) > MaxBytes {
		return &Error{Kind: TooLarge, Line: 1 + bytes.Count(src[:MaxBytes], []byte("\n")), Message: fmt.Sprintf(
			"the file is larger than %d MiB, the limit for one YAML file (it bounds the memory and time of parsing; %s is far smaller): %s",
			MaxBytes>>20, doc.Name, doc.TooLarge)}
	}
	text, err := utf8Text(src)
	if err != nil {
		return err
	}
	s := scanner{limit: MaxDepth, doc: doc, opened: true}
	if s.scan(text); s.err != nil {
		return s.err
	}
	return nil
}

// scan runs the scanner over text, line by line, until an error.
func (s *scanner) scan(text []byte) {
	for len(text) > 0 {
		line := text
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			text = nil
		}
		s.line++
		if s.scanLine(bytes.TrimSuffix(line, []byte("\r"))); s.err != nil {
			return
		}
	}
}

// utf8Text is src as UTF-8: UTF-16 with a byte-order mark is converted
// (for the scan only; the parsers read the original). Invalid UTF-8 is an
// *Error at its line and column.
func utf8Text(src []byte) ([]byte, error) {
	if len(src) >= 2 && (src[0] == 0xfe && src[1] == 0xff || src[0] == 0xff && src[1] == 0xfe) {
		u := make([]uint16, 0, len(src)/2)
		for i := 2; i+1 < len(src); i += 2 {
			if src[0] == 0xfe {
				u = append(u, uint16(src[i])<<8|uint16(src[i+1]))
			} else {
				u = append(u, uint16(src[i+1])<<8|uint16(src[i]))
			}
		}
		return []byte(string(utf16.Decode(u))), nil
	}
	if utf8.Valid(src) {
		return src, nil
	}
	line, start := 1, 0
	for i := 0; i < len(src); {
		r, n := utf8.DecodeRune(src[i:])
		if r == utf8.RuneError && n <= 1 {
			return nil, &Error{Kind: NotUTF8, Line: line, Column: 1 + utf8.RuneCount(src[start:i]), Message: fmt.Sprintf(
				"byte 0x%02x is not UTF-8: YAML files must be UTF-8 (or UTF-16 with a byte-order mark); save the file as UTF-8", src[i])}
		}
		if r == '\n' {
			line, start = line+1, i+1
		}
		i += n
	}
	return src, nil
}

// scanner holds the state of the pre-scan between lines.
type scanner struct {
	limit int
	doc   Doc
	line  int
	err   *Error
	max   int // the deepest nesting seen

	// stack holds the columns of the open block collections.
	stack []int
	// flow is the number of open flow collections.
	flow int
	// atStart: in a flow collection, the next character may start a
	// node (after [ { , : or a property), so a quote opens a scalar.
	atStart bool
	// quote is the quote character of a quoted scalar that spans lines.
	quote byte
	// blockScalar: inside the content of a | or > scalar, whose lines
	// are those indented more than scalarParent (-1 at the top level).
	blockScalar  bool
	scalarParent int
	// opened: the last block line ended with an empty value (key:, -, ?,
	// a property) or a document starts, so a more indented line is a
	// nested collection; else it continues a plain scalar.
	opened bool
	// keyCol is where the current block node started: its column, should
	// a ':' make it a key.
	keyCol int
}

func (s *scanner) top() int {
	if len(s.stack) == 0 {
		return -1
	}
	return s.stack[len(s.stack)-1]
}

// push opens a nesting level at col (0-based) of line b, or records the
// error when it is one too many.
func (s *scanner) push(b []byte, col int) bool {
	s.stack = append(s.stack, col)
	return s.deeper(b, col)
}

func (s *scanner) deeper(b []byte, col int) bool {
	s.max = max(s.max, len(s.stack)+s.flow)
	if s.max <= s.limit {
		return true
	}
	s.err = &Error{Kind: TooDeep, Line: s.line, Column: 1 + utf8.RuneCount(b[:col]), Message: fmt.Sprintf(
		"nesting deeper than %d levels; %s needs fewer than %d: is the file generated?", s.limit, s.doc.Name, s.doc.Depth)}
	return false
}

func sep(b []byte, i int) bool { return i >= len(b) || b[i] == ' ' || b[i] == '\t' }

func docMarker(b []byte) bool {
	return len(b) >= 3 && (string(b[:3]) == "---" || string(b[:3]) == "...") && sep(b, 3)
}

func (s *scanner) scanLine(b []byte) {
	if s.blockScalar {
		ind := indent(b)
		if !docMarker(b) && (ind == len(b) || ind > s.scalarParent) {
			return // content or a blank line
		}
		s.blockScalar = false
	}
	switch {
	case s.quote != 0:
		i, ok := closeQuote(b, 0, s.quote)
		if !ok {
			return
		}
		s.quote = 0
		if s.flow > 0 {
			s.atStart = false
			s.scanFlow(b, i)
		} else {
			s.afterNode(b, i)
		}
		return
	case s.flow > 0:
		s.scanFlow(b, 0)
		return
	}
	ind := indent(b)
	if ind == len(b) || b[ind] == '#' {
		return // blank or a comment
	}
	if docMarker(b) {
		s.stack, s.opened = s.stack[:0], false
		s.nodeStart(b, 3) // opened when nothing follows the marker
		return
	}
	for len(s.stack) > 0 && s.top() > ind {
		s.stack = s.stack[:len(s.stack)-1]
	}
	if s.top() < ind && !s.opened {
		return // a plain scalar's next line
	}
	// A key or an entry at ind opens a collection there (nodeStart):
	// a line of a scalar or of a flow collection does not.
	s.opened = false
	s.nodeStart(b, ind)
}

func indent(b []byte) int {
	i := 0
	for i < len(b) && b[i] == ' ' {
		i++
	}
	return i
}

// nodeStart scans block content from i, where a node may start.
func (s *scanner) nodeStart(b []byte, i int) {
	props := -1 // the column of the node's first property (&anchor, !tag)
	at := func(i int) int {
		if props >= 0 {
			return props
		}
		return i
	}
	for {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
			i++
		}
		if i >= len(b) || b[i] == '#' {
			s.opened = true // an empty value: a collection may follow
			return
		}
		switch c := b[i]; {
		case (c == '-' || c == '?') && sep(b, i+1):
			// a sequence entry or an explicit key: its content is a
			// collection nested at its column
			if s.top() < i && !s.push(b, i) {
				return
			}
			i, props = i+1, -1
		case c == ':' && sep(b, i+1):
			i, props = i+1, -1 // an explicit key's value
		case c == '|' || c == '>':
			s.blockScalar, s.scalarParent = true, s.top()
			return
		case c == '&' || c == '!':
			props = at(i)
			for i < len(b) && !sep(b, i) {
				i++
			}
		case c == '[' || c == '{':
			s.keyCol = at(i)
			s.scanFlow(b, i)
			return
		case c == '"' || c == '\'':
			s.keyCol = at(i)
			end, ok := closeQuote(b, i+1, c)
			if !ok {
				s.quote = c
				return
			}
			s.afterNode(b, end)
			return
		default:
			// a plain scalar (or an alias), a key when ": " follows
			s.keyCol = at(i)
			j := plainEnd(b, i)
			if j == len(b) || b[j] == '#' || !s.key(b) {
				return
			}
			i, props = j+1, -1
		}
	}
}

// plainEnd is the index of the ": " that ends the plain scalar at i, of
// the comment after it, or len(b).
func plainEnd(b []byte, i int) int {
	for j := i; j < len(b); j++ {
		if b[j] == ':' && sep(b, j+1) || b[j] == '#' && j > i && (b[j-1] == ' ' || b[j-1] == '\t') {
			return j
		}
	}
	return len(b)
}

// afterNode scans block content after a quoted scalar or a flow
// collection that started at s.keyCol: a ':' makes it a key.
func (s *scanner) afterNode(b []byte, i int) {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
		i++
	}
	if i < len(b) && b[i] == ':' && sep(b, i+1) && s.key(b) {
		s.nodeStart(b, i+1)
	}
}

// key records a mapping key at s.keyCol: right of the innermost
// collection's column it opens a compact mapping (`- name: x`).
func (s *scanner) key(b []byte) bool {
	if s.top() < s.keyCol {
		return s.push(b, s.keyCol)
	}
	return true
}

// scanFlow scans flow content from i; when the outermost flow collection
// closes, the rest of the line is block content after a node.
func (s *scanner) scanFlow(b []byte, i int) {
	for ; i < len(b); i++ {
		switch c := b[i]; c {
		case ' ', '\t':
		case '#':
			if i == 0 || b[i-1] == ' ' || b[i-1] == '\t' {
				return
			}
			s.atStart = false
		case '[', '{':
			s.flow++
			if !s.deeper(b, i) {
				return
			}
			s.atStart = true
		case ']', '}':
			if s.flow > 0 {
				s.flow--
			}
			s.atStart = false
			if s.flow == 0 {
				s.afterNode(b, i+1)
				return
			}
		case ',', ':':
			s.atStart = true
		case '"', '\'':
			if !s.atStart {
				continue
			}
			end, ok := closeQuote(b, i+1, c)
			if !ok {
				s.quote = c
				return
			}
			i, s.atStart = end-1, false
		case '&', '!':
			if !s.atStart {
				continue
			}
			for i+1 < len(b) && !sep(b, i+1) && b[i+1] != ',' && b[i+1] != ']' && b[i+1] != '}' {
				i++
			}
		case '?', '-':
			if !s.atStart || !sep(b, i+1) {
				s.atStart = false
			}
		default:
			s.atStart = false
		}
	}
}

// closeQuote finds the end of a quoted scalar opened by q, from i: the
// index after the closing quote, or false when it goes on past the line.
func closeQuote(b []byte, i int, q byte) (int, bool) {
	for ; i < len(b); i++ {
		switch {
		case q == '"' && b[i] == '\\':
			i++
		case b[i] == q && q == '\'' && i+1 < len(b) && b[i+1] == '\'':
			i++
		case b[i] == q:
			return i + 1, true
		}
	}
	return 0, false
}
