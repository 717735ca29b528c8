package yamlscan

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// scanDepth is the deepest nesting the pre-scan counts in src.
func scanDepth(t *testing.T, src string) int {
	t.Helper()
	s := scanner{limit: 1 << 30, opened: true}
	s.scan([]byte(src))
	if s.err != nil {
		t.Fatalf("scan: %v", s.err)
	}
	return s.max
}

// nodeDepth is the nesting of collections in a parsed document (aliases
// not followed), what the pre-scan estimates.
func nodeDepth(n *yaml.Node) int {
	d := 0
	for _, c := range n.Content {
		d = max(d, nodeDepth(c))
	}
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		d++
	}
	return d
}

func parsedDepth(t *testing.T, src string) int {
	t.Helper()
	dec := yaml.NewDecoder(strings.NewReader(src))
	d := 0
	for {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			if err.Error() == "EOF" {
				return d
			}
			t.Fatalf("not valid YAML: %v\n%s", err, src)
		}
		d = max(d, nodeDepth(&n))
	}
}

// The scan counts block levels by indentation and flow levels by [ and {,
// and nothing in quoted scalars, block scalars, comments or plain scalars:
// it never counts more than the parsed depth.
func TestScanDepth(t *testing.T) {
	for _, c := range []struct {
		name, src string
		want      int
	}{
		{"flow", "spec: [[[1]]]\n", 4},
		{"flow objects", "a: {b: {c: [x]}}\n", 4},
		{"block mappings", "a:\n  b:\n    c:\n      d: 1\n", 4},
		{"block sequence under a key at its indent", "a:\n- b:\n  - c\n", 2}, // parsed: 4
		{"compact sequences", "- - - - x\n", 4},
		{"sequence entries of mappings", "- name: a\n  sub:\n    x: 1\n- name: b\n", 3},
		{"dash lines", "-\n  -\n    -\n      - x\n", 4},
		{"brackets in double quotes", "a: \"[[[{{{\"\nb: \"x\\\"[[[\"\n", 1},
		{"brackets in single quotes", "a: '[[[''[[['\nb: ['[[[', \"{{\"]\n", 2},
		{"brackets in a comment", "a: 1 # [[[[[[\n# {{{{{{\nb: [1] # [[[[\n", 2},
		{"brackets in a plain scalar", "a: x[[[[\nb: it's [[[\nc: [a, b#c]\n", 2},
		{"hash in a plain scalar is no comment", "a: b#c\nd: [[1]]\n", 3},
		{"brackets in a block scalar", "a: |\n  [[[[[[\n  {{{{{\n\n  - - - -\nb: >-\n    [[[[\n", 1},
		{"block scalar in a sequence", "- |\n  [[[[\n- - x\n", 2},
		{"multi-line double quote", "a: \"[[[\n  [[[ \\\" [[[\n  \"\nb: [1]\n", 2},
		{"multi-line single quote", "a: '[[[\n  [['' [[[\n  '\nb: [[1]]\n", 3},
		{"multi-line flow", "a: [\n  \"]]]\", # ]]]\n  [1, {b: 2}],\n]\nc: [1]\n", 4},
		{"plain scalar continued deeper", "a: one\n  - two\n    - three\n      x four\n", 1},
		{"quoted key", "\"a: [\": {b: 1}\n'c': [[2]]\n", 3},
		{"flow key", "[a, b]: c\n", 1}, // parsed: 2
		{"properties", "a: &x\n  b: !!map\n    c: 1\nd: *x\n", 3},
		{"a property before a key", "? 0\n! 0: 0\n", 1},
		{"properties before a key in an entry", "- &a !t k: v\n  j: w\n", 2},
		{"documents", "a:\n  b: [1]\n---\nc: 1\n--- |\n  [[[[\n---\n- [[1]]\n", 3},
		{"json", "{\"a\": {\"b\": [1, {\"c\": \"[[[\"}]}}\n", 4},
		{"crlf", "a:\r\n  b:\r\n    c: [1]\r\n", 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := scanDepth(t, c.src); got != c.want {
				t.Errorf("scan depth %d, want %d", got, c.want)
			}
			if d := parsedDepth(t, c.src); c.want > d {
				t.Errorf("the scan counts %d, more than the parsed depth %d", c.want, d)
			}
		})
	}
}

// Every route, snapshot and CART base of the repository is well within the
// limit, and the scan never counts more than the parsed depth.
func TestScanCorpus(t *testing.T) {
	var files []string
	for _, g := range []string{"testdata/routes/*/*.yaml", "testdata/routes/*/*/*.yaml", "testdata/snapshots/*.yaml", "deploy/samples/*.yaml", "testdata/script/*.txtar"} {
		m, _ := filepath.Glob(filepath.Join("../..", g))
		files = append(files, m...)
	}
	if len(files) < 50 {
		t.Fatalf("found only %d files", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		srcs := []string{string(b)}
		if filepath.Base(f) == "vet_deep_nesting.txtar" {
			continue // deep on purpose
		}
		if strings.HasSuffix(f, ".txtar") {
			srcs = txtarYAML(string(b))
		}
		for _, src := range srcs {
			d := scanDepth(t, src)
			if d >= 15 {
				t.Errorf("%s: scan depth %d", f, d)
			}
			var n yaml.Node
			if yaml.Unmarshal([]byte(src), &n) == nil && d > nodeDepth(&n) && !strings.Contains(src, "\n---") {
				t.Errorf("%s: scan depth %d, parsed %d", f, d, nodeDepth(&n))
			}
		}
	}
}

// txtarYAML is the .yaml sections of a txtar script.
func txtarYAML(s string) []string {
	var out []string
	parts := strings.Split(s, "\n-- ")
	for _, p := range parts[1:] {
		name, body, ok := strings.Cut(p, " --\n")
		if ok && (strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".json")) {
			out = append(out, body)
		}
	}
	return out
}

var route = Doc{Name: "a ModelRoute", Depth: 15, TooLarge: "split it into several files"}

func TestCheckDepth(t *testing.T) {
	deep := "apiVersion: v1\nkind: ModelRoute\nspec: " + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + "\n"
	err := Check([]byte(deep), route)
	var e *Error
	if !errors.As(err, &e) || e.Line != 3 || e.Column != 6+100 {
		t.Fatalf("got %v, want line 3 column 106", err)
	}
	if want := "3:106: nesting deeper than 100 levels; a ModelRoute needs fewer than 15: is the file generated?"; err.Error() != want {
		t.Errorf("got %q, want %q", err, want)
	}
	// exactly the limit passes
	ok := "a: " + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + "\n"
	if err := Check([]byte(ok), route); err != nil {
		t.Errorf("depth %d refused: %v", MaxDepth, err)
	}
	// block nesting: one more key line than the limit
	var b strings.Builder
	for i := range MaxDepth + 1 {
		b.WriteString(strings.Repeat(" ", i) + "k:\n")
	}
	if err := Check([]byte(b.String()), route); !errors.As(err, &e) || e.Line != MaxDepth+1 || e.Column != MaxDepth+1 {
		t.Errorf("block nesting: got %v, want line and column %d", err, MaxDepth+1)
	}
	// compact sequences, two bytes a level
	if err := Check([]byte("a:\n"+strings.Repeat("- ", 5000)+"x\n"), route); !errors.As(err, &e) || e.Line != 2 || e.Column != 1+2*MaxDepth {
		t.Errorf("compact sequences: got %v, want 2:%d", err, 1+2*MaxDepth)
	}
	// brackets in strings and comments of any number pass
	flat := "a: \"" + strings.Repeat("[", 50000) + "\" # " + strings.Repeat("{", 50000) + "\nb: |\n  " + strings.Repeat("[", 50000) + "\n"
	if err := Check([]byte(flat), route); err != nil {
		t.Errorf("brackets in scalars and comments refused: %v", err)
	}
}

func TestCheckSize(t *testing.T) {
	line := strings.Repeat("x", 1023) + "\n"
	big := []byte("a: |\n" + strings.Repeat(line, MaxBytes/1024+1))
	err := Check(big, route)
	var e *Error
	if !errors.As(err, &e) || e.Line != 1+MaxBytes/1024 || !strings.Contains(e.Message, "larger than 4 MiB") {
		t.Fatalf("got %v, want the line of byte %d and the limit", err, MaxBytes)
	}
	if err := Check(big[:MaxBytes], route); err != nil {
		t.Errorf("exactly %d bytes refused: %v", MaxBytes, err)
	}
}

func TestCheckEncoding(t *testing.T) {
	err := Check([]byte("a: 1\nb: \"é\xffx\"\n"), route)
	var e *Error
	if !errors.As(err, &e) || e.Line != 2 || e.Column != 6 || !strings.Contains(e.Message, "byte 0xff is not UTF-8") {
		t.Fatalf("got %v, want 2:6 byte 0xff", err)
	}
	// UTF-16 with a byte-order mark is YAML; it is scanned as text
	for _, bom := range []string{"\xff\xfe", "\xfe\xff"} {
		var b []byte
		b = append(b, bom...)
		for _, r := range "a: " + strings.Repeat("[", 200) + strings.Repeat("]", 200) + "\n" {
			if bom == "\xff\xfe" {
				b = append(b, byte(r), 0)
			} else {
				b = append(b, 0, byte(r))
			}
		}
		if err := Check(b, route); !errors.As(err, &e) || e.Line != 1 || e.Column != 4+MaxDepth-1 {
			t.Errorf("UTF-16 %x: got %v, want nesting refused at 1:%d", bom, err, 4+MaxDepth-1)
		}
		if err := Check(b[:2+2*10], route); err != nil {
			t.Errorf("UTF-16 %x: %v", bom, err)
		}
	}
}

// FuzzScanDepth: on any input yaml.v3 parses, the scan never counts more
// than the parsed depth, so Check refuses no valid file that is within
// the limit.
func FuzzScanDepth(f *testing.F) {
	for _, s := range []string{
		"a: [[1]]\n", "- - x\n", "a: |\n  [[\nb: 1\n", "a: \"[\n [\"\n", "a: 'it''s [' # [\n",
		"{\"a\": [1, {\"b\": 2}]}\n", "a: b\n  - c\n", "? [a]\n: {b: c}\n", "--- [a]\n--- {b: c}\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		dec := yaml.NewDecoder(strings.NewReader(src))
		d := 0
		for {
			var n yaml.Node
			err := dec.Decode(&n)
			if err != nil {
				if err.Error() != "EOF" {
					return // not YAML: the parser's own error answers
				}
				break
			}
			d = max(d, nodeDepth(&n))
		}
		text, err := utf8Text([]byte(src))
		if err != nil {
			return
		}
		s := scanner{limit: 1 << 30, opened: true}
		if s.scan(text); s.max > d {
			t.Errorf("scan depth %d, parsed %d:\n%q", s.max, d, src)
		}
	})
}
