package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// repoRoot is the repository root seen from this package's directory. The
// judges run there, so the schema module is ./schema/ and every route is
// named by its path in the repository.
const repoRoot = "../.."

// TestCorpusJudges runs both judges — `autoconfig vet` and the pinned CUE
// CLI's `cue vet` on the schema module — on every corpus route, one subtest
// per file: TestCorpusJudges/{valid,samples,invalid}/<file>.yaml. Both must
// accept every valid route and sample; both must reject every invalid route,
// autoconfig vet with the file's "# want: " message and cue vet with its
// "# want-cue: " message (the raw CUE wording, where autoconfig vet rewrites
// it), else the "# want: " one. testdata/routes/README.md describes the
// corpus. The TestMain of this package puts both commands on $PATH.
func TestCorpusJudges(t *testing.T) {
	groups := []struct{ name, dir string }{
		{"valid", "testdata/routes/valid"},
		{"samples", "deploy/samples"},
		{"invalid", "testdata/routes/invalid"},
	}
	for _, g := range groups {
		files, err := filepath.Glob(filepath.Join(repoRoot, g.dir, "*.yaml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no routes in %s (%v)", g.dir, err)
		}
		t.Run(g.name, func(t *testing.T) {
			for _, f := range files {
				rel := g.dir + "/" + filepath.Base(f)
				t.Run(filepath.Base(f), func(t *testing.T) {
					t.Parallel()
					if g.name != "invalid" {
						accept(t, rel, "autoconfig", "vet", rel)
						accept(t, rel, "cue", "vet", "-c", "./schema/", rel, "-d", "#ModelRoute")
						return
					}
					src, err := os.ReadFile(f)
					if err != nil {
						t.Fatal(err)
					}
					want, wantCue := header(src, "# want: "), header(src, "# want-cue: ")
					if want == "" {
						t.Fatalf("%s: no '# want: ' line", rel)
					}
					if wantCue == "" {
						wantCue = want
					}
					reject(t, rel, want, "autoconfig", "vet", rel)
					reject(t, rel, wantCue, "cue", "vet", "-c", "./schema/", rel, "-d", "#ModelRoute")
				})
			}
		})
	}
	// Directories: autoconfig vet walks them and accepts the lot.
	t.Run("valid-directories", func(t *testing.T) {
		accept(t, "testdata/routes/valid, deploy/samples", "autoconfig", "vet", "testdata/routes/valid", "deploy/samples")
	})
}

// judge runs one judge in the repository root and returns its stderr and
// exit code.
func judge(t *testing.T, name string, args ...string) (stderr string, code int) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = repoRoot
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && exit.Exited():
		code = exit.ExitCode()
	default:
		t.Fatalf("%s: %v\n%s", cmdline(name, args), err, errb.String())
	}
	return errb.String(), code
}

// accept fails unless the judge accepts file (exit 0).
func accept(t *testing.T, file, name string, args ...string) {
	t.Helper()
	if stderr, code := judge(t, name, args...); code != 0 {
		t.Errorf("%s: valid, but `%s` rejects it (exit %d):\n%s", file, cmdline(name, args), code, indent(stderr))
	}
}

// reject fails unless the judge rejects file (non-zero exit) with a message
// containing want.
func reject(t *testing.T, file, want, name string, args ...string) {
	t.Helper()
	stderr, code := judge(t, name, args...)
	switch {
	case code == 0:
		t.Errorf("%s: invalid, but `%s` accepts it; want a rejection containing %q", file, cmdline(name, args), want)
	case !strings.Contains(stderr, want):
		t.Errorf("%s: `%s` rejects it (exit %d), but without the expected message\n  want: %s\n  got:\n%s", file, cmdline(name, args), code, want, indent(stderr))
	}
}

func cmdline(name string, args []string) string {
	return strings.Join(append([]string{name}, args...), " ")
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "    (no output)"
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}

// header returns the rest of the first line of src that starts with prefix.
func header(src []byte, prefix string) string {
	for _, l := range strings.Split(string(src), "\n") {
		if v, ok := strings.CutPrefix(l, prefix); ok {
			return v
		}
	}
	return ""
}
