package buildinfo_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/modelsphere/autoconfig/internal/buildinfo"
	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

var binaries = []string{"autoconfig", "reload", "hagate", "readyz"}

// TestMakeBuildStampsEveryBinary: `make build` stamps all four binaries
// with the version, the commit and its date, and --version prints them; a
// plain go build says it is unstamped.
func TestMakeBuildStampsEveryBinary(t *testing.T) {
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	commit, err := exec.Command("git", "-C", root, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	bin := t.TempDir()
	if out, err := exec.Command("make", "-C", root, "build", "BIN="+bin).CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	for _, b := range binaries {
		out, err := exec.Command(filepath.Join(bin, b), "--version").Output()
		want := b + " " + cli.Version + " (commit " + strings.TrimSpace(string(commit)) + ", built 20"
		if err != nil || !strings.HasPrefix(string(out), want) {
			t.Errorf("%s --version = %q (%v), want %q…", b, out, err, want)
		}
	}
	plain := filepath.Join(t.TempDir(), "readyz")
	if out, err := exec.Command("go", "build", "-C", root, "-o", plain, "./cmd/readyz").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if out, _ := exec.Command(plain, "--version").Output(); !strings.Contains(string(out), "unstamped build") {
		t.Errorf("a plain go build says %q, want it to say it is unstamped", out)
	}
}

// TestCollector: autoconfig_build_info is 1 with the build's labels.
func TestCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildinfo.Collector("reload"))
	want := `# HELP autoconfig_build_info Always 1; the labels say which build of which binary runs (commit and build_date are unknown in an unstamped build).
# TYPE autoconfig_build_info gauge
autoconfig_build_info{binary="reload",build_date="unknown",commit="unknown",version="` + cli.Version + `"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), buildinfo.Name); err != nil {
		t.Error(err)
	}
}
