package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// severalDir holds routes with several independent problems each, listed
// by their "# problem: LINE:COL [kind] path: message" lines
// (testdata/routes/README.md).
const severalDir = "testdata/routes/invalid/several"

var problemLine = regexp.MustCompile(`^# problem: (\d+):(\d+) \[\w+\] (.+?): (.+)$`)

// severalProblem is one "# problem:" line.
type severalProblem struct {
	line, col     int
	path, message string // message: a prefix of it
}

// TestSeveralProblemsBothJudges: on every route of the several/ corpus,
// `autoconfig vet` and the pinned `cue vet` (what a user's CI runs) each
// report every problem the file lists, in one run, and nothing else:
// autoconfig vet as file:line:column: path: message; cue vet with the path
// (a rule across fields under a hidden field such as _rule, then the
// field's path) and, where CUE locates the error in the route file, at the
// problem's line.
func TestSeveralProblemsBothJudges(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repoRoot, severalDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no routes in %s (%v)", severalDir, err)
	}
	for _, f := range files {
		rel := severalDir + "/" + filepath.Base(f)
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Parallel()
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var want []severalProblem
			for _, l := range strings.Split(string(src), "\n") {
				if m := problemLine.FindStringSubmatch(l); m != nil {
					p := severalProblem{path: m[3], message: m[4]}
					p.line, _ = strconv.Atoi(m[1])
					p.col, _ = strconv.Atoi(m[2])
					want = append(want, p)
				}
			}
			if len(want) < 2 {
				t.Fatalf("%s: want at least two '# problem:' lines", rel)
			}
			t.Run("autoconfig-vet", func(t *testing.T) {
				stderr, code := judge(t, "autoconfig", "vet", rel)
				if code == 0 {
					t.Fatalf("accepted; want %d problems", len(want))
				}
				checkVetOutput(t, rel, want, stderr)
			})
			t.Run("cue-vet", func(t *testing.T) {
				stderr, code := judge(t, "cue", "vet", "-c", "./schema/", rel, "-d", "#ModelRoute")
				if code == 0 {
					t.Fatalf("accepted; want %d problems", len(want))
				}
				checkCueOutput(t, rel, want, stderr)
			})
		})
	}
}

// checkVetOutput: one line per problem, exactly the wanted ones.
func checkVetOutput(t *testing.T, rel string, want []severalProblem, stderr string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for _, w := range want {
		prefix := fmt.Sprintf("%s:%d:%d: %s: %s", rel, w.line, w.col, w.path, w.message)
		i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, prefix) })
		if i < 0 {
			t.Errorf("not reported: %s", prefix)
			continue
		}
		lines = slices.Delete(lines, i, i+1)
	}
	for _, l := range lines {
		t.Errorf("reported but not expected: %s", l)
	}
}

// cueError is one error of cue vet's output: "path: message:" and the
// positions below it.
type cueError struct {
	path, message string
	positions     []string
}

// checkCueOutput: one error per problem, exactly the wanted ones.
func checkCueOutput(t *testing.T, rel string, want []severalProblem, stderr string) {
	t.Helper()
	var errs []cueError
	for _, l := range strings.Split(strings.TrimRight(stderr, "\n"), "\n") {
		if strings.HasPrefix(l, " ") {
			if len(errs) > 0 {
				errs[len(errs)-1].positions = append(errs[len(errs)-1].positions, strings.TrimSpace(l))
			}
			continue
		}
		path, msg, ok := strings.Cut(strings.TrimSuffix(l, ":"), ": ")
		if !ok {
			t.Fatalf("unexpected cue vet line %q", l)
		}
		errs = append(errs, cueError{path: dataPath(path), message: msg})
	}
	for _, w := range want {
		i := slices.IndexFunc(errs, func(e cueError) bool {
			return e.path == w.path && strings.HasPrefix(e.message, w.message)
		})
		if i < 0 {
			t.Errorf("not reported: %s: %s", w.path, w.message)
			continue
		}
		// A position in the route file, if CUE gives one, is on the
		// problem's line.
		var inFile []string
		for _, p := range errs[i].positions {
			if strings.Contains(p, rel+":") {
				inFile = append(inFile, p)
			}
		}
		at := fmt.Sprintf("%s:%d:", rel, w.line)
		if len(inFile) > 0 && !slices.ContainsFunc(inFile, func(p string) bool { return strings.Contains(p, at) }) {
			t.Errorf("%s: %s: positions %v, want line %d", w.path, w.message, inFile, w.line)
		}
		errs = slices.Delete(errs, i, i+1)
	}
	for _, e := range errs {
		t.Errorf("reported but not expected: %s: %s", e.path, e.message)
	}
}

// dataPath is the document path of a path as cue vet prints it: hidden
// labels (a rule's record, e.g. _rule.spec.nginx.route) dropped, quoted
// labels unquoted.
func dataPath(p string) string {
	var out []string
	for len(p) > 0 {
		var label string
		if p[0] == '"' {
			end := 1
			for end < len(p) && p[end] != '"' {
				if p[end] == '\\' {
					end++
				}
				end++
			}
			label, _ = strconv.Unquote(p[:min(end+1, len(p))])
			p = p[min(end+1, len(p)):]
		} else {
			label, p, _ = strings.Cut(p, ".")
			if !strings.HasPrefix(label, "_") {
				out = append(out, label)
			}
			continue
		}
		out = append(out, label)
		p = strings.TrimPrefix(p, ".")
	}
	return strings.Join(out, ".")
}
