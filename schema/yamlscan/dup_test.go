package yamlscan

import (
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

func TestDuplicates(t *testing.T) {
	src := `a: 1
b:
  - {x: 1, y: 2, x: 3}
  - x: 1
<<: {a: 2}
c: &c {k: 1}
d: *c
"a": 4
`
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(src), &n); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range Duplicates(&n) {
		got = append(got, d.Path+" "+d.Message())
	}
	want := []string{
		`b.0.x key "x" repeats the one on line 3 (column 6): a mapping holds each key once; delete one of them`,
		`a key "a" repeats the one on line 1: a mapping holds each key once; delete one of them`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
