package schema_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/modelsphere/autoconfig/schema"
)

// severalDir holds routes with several independent problems each
// (testdata/routes/README.md).
const severalDir = "../testdata/routes/invalid/several"

// problemKinds are the kinds of rules a "# problem:" line names: a rule on
// a field's value, an unknown field, a missing field, a rule across fields,
// a rule on a whole struct or list, a key of a wrong form.
var problemKinds = []string{"value", "unknown", "required", "cross", "whole", "key"}

// wantProblem is one "# problem: LINE:COL [kind] path: message" line.
type wantProblem struct {
	line, col  int
	kind, path string
	message    string // a prefix of the message
}

func (w wantProblem) String() string {
	return fmt.Sprintf("%d:%d %s: %s", w.line, w.col, w.path, w.message)
}

var problemLine = regexp.MustCompile(`^# problem: (\d+):(\d+) \[(\w+)\] (.+?): (.+)$`)

// wantProblems reads the "# problem:" lines of a corpus file.
func wantProblems(t *testing.T, src []byte) []wantProblem {
	t.Helper()
	var out []wantProblem
	for _, l := range strings.Split(string(src), "\n") {
		if !strings.HasPrefix(l, "# problem:") {
			continue
		}
		m := problemLine.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("malformed problem line %q", l)
		}
		w := wantProblem{kind: m[3], path: m[4], message: m[5]}
		fmt.Sscan(m[1], &w.line)
		fmt.Sscan(m[2], &w.col)
		if !slices.Contains(problemKinds, w.kind) {
			t.Fatalf("%q: kind %q is none of %v", l, w.kind, problemKinds)
		}
		out = append(out, w)
	}
	if len(out) < 2 {
		t.Fatalf("want at least two '# problem:' lines, found %d", len(out))
	}
	return out
}

// TestEveryProblemAtOnce: each route of the several/ corpus has several
// independent problems (an unknown field next to a rule across fields, a
// rule on a whole struct, bad values, missing fields, …), and one
// validation reports every one of them, each at the line and column of
// the field it names, and nothing else.
func TestEveryProblemAtOnce(t *testing.T) {
	v := mustValidator(t)
	for _, f := range glob(t, filepath.Join(severalDir, "*.yaml")) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			want := wantProblems(t, src)
			_, err = v.Validate(f, src)
			var inv *schema.InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("want %d problems, got %v", len(want), err)
			}
			checkProblems(t, want, inv.Problems)
		})
	}
}

// checkProblems fails unless got holds exactly the wanted problems.
func checkProblems(t *testing.T, want []wantProblem, got []schema.Problem) {
	t.Helper()
	left := slices.Clone(got)
	for _, w := range want {
		i := slices.IndexFunc(left, func(p schema.Problem) bool {
			return p.Line == w.line && p.Column == w.col && p.Path == w.path && strings.HasPrefix(p.Message, w.message)
		})
		if i < 0 {
			t.Errorf("not reported: %s", w)
			continue
		}
		left = slices.Delete(left, i, i+1)
	}
	for _, p := range left {
		t.Errorf("reported but not expected: %d:%d %s: %s", p.Line, p.Column, p.Path, p.Message)
	}
}

// TestSeveralCoversEveryPairOfKinds: for every two kinds of rules, some
// route of the several/ corpus has a problem of each, so that no kind of
// rule is known to hide another only by chance.
func TestSeveralCoversEveryPairOfKinds(t *testing.T) {
	seen := map[[2]string]bool{}
	for _, f := range glob(t, filepath.Join(severalDir, "*.yaml")) {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		kinds := map[string]bool{}
		for _, w := range wantProblems(t, src) {
			kinds[w.kind] = true
		}
		for a := range kinds {
			for b := range kinds {
				seen[[2]string{a, b}] = true
			}
		}
	}
	for i, a := range problemKinds {
		for _, b := range problemKinds[i+1:] {
			if !seen[[2]string{a, b}] {
				t.Errorf("no route of %s has both a %s and a %s problem", severalDir, a, b)
			}
		}
	}
}
