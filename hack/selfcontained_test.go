// Package hack holds the repository's build scripts; its test checks the
// repository as a whole.
package hack

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// outsideRefs are names of files that live outside this repository. A
// comment, script or document that points at them cannot be followed from a
// clone: state the fact itself instead.
var outsideRefs = []string{"../shared", "FACTS.md", "SPEC.md", "STYLE.md", "STYLE habit", "SPEC \""}

// self names the patterns, so it is not checked.
const self = "hack/selfcontained_test.go"

// TestNoReferencesOutsideTheRepository fails when a tracked file of the
// repository mentions a file outside it.
func TestNoReferencesOutsideTheRepository(t *testing.T) {
	files := repoFiles(t)
	checked := 0
	for _, rel := range files {
		if rel == self {
			continue
		}
		src, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(rel)))
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the working tree, not yet committed
			}
			t.Fatal(err)
		}
		if bytes.IndexByte(src, 0) >= 0 {
			continue // binary
		}
		checked++
		for i, line := range strings.Split(string(src), "\n") {
			for _, ref := range outsideRefs {
				if strings.Contains(line, ref) {
					t.Errorf("%s:%d: mentions %q, which is outside this repository; state the fact itself:\n\t%s", rel, i+1, ref, strings.TrimSpace(line))
				}
			}
		}
	}
	if checked < 100 {
		t.Fatalf("checked only %d files; is the test running from hack/?", checked)
	}
}

// repoFiles lists the repository's files relative to its root: the tracked
// files when git is available, else every file outside dot-directories
// (.git, .cache) and bin/.
func repoFiles(t *testing.T) []string {
	t.Helper()
	if out, err := exec.Command("git", "-C", "..", "ls-files", "-z").Output(); err == nil && len(out) > 0 {
		return strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	}
	var files []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel("..", path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch {
		case d.IsDir() && rel != "." && (strings.HasPrefix(d.Name(), ".") || rel == "bin"):
			return filepath.SkipDir
		case d.Type().IsRegular():
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
