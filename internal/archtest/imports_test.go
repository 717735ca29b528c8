package archtest

import (
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/modelsphere/autoconfig"

// deps lists the packages pkg (a path inside the module) imports,
// directly or not, test files excluded: what its binary or importer links.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", module+"/"+pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	return strings.Fields(string(out))
}

// std reports a standard-library package (no dot in the first element).
func std(p string) bool {
	first, _, _ := strings.Cut(p, "/")
	return !strings.Contains(first, ".")
}

func under(p string, prefixes ...string) bool {
	for _, pre := range prefixes {
		if p == pre || strings.HasPrefix(p, pre+"/") {
			return true
		}
	}
	return false
}

var (
	cue              = "cuelang.org"
	clientGo         = "k8s.io/client-go"
	controllerRT     = "sigs.k8s.io/controller-runtime"
	self             = func(p string) string { return module + "/" + p }
	controlPlanePkgs = []string{self("compiler"), self("schema"), self("internal/controller"), self("internal/informer"), self("internal/discovery"), self("internal/sink"), self("internal/scaler"), self("internal/crdgen"), self("internal/celcheck")}
)

// rule is one architecture rule: pkg must not link anything deny matches;
// want names a package the graph must contain, so the rule is proved to
// be looking at the real graph.
type rule struct {
	pkg  string
	why  string
	deny func(dep string) bool
	want string
}

func rules() []rule {
	return []rule{
		{
			pkg:  "compiler",
			why:  "the compiler is pure Go: no Kubernetes package, no CUE; only its input types, the endpoint type, the peers table format and YAML",
			deny: func(d string) bool { return !std(d) && !slices.Contains(compilerDeps, d) },
			want: self("schema/routespec"),
		},
		{
			pkg:  "schema/routespec",
			why:  "the spec types are importable with no dependency at all",
			deny: func(d string) bool { return !std(d) && d != self("schema/routespec") },
			want: "strings",
		},
		{
			pkg:  "schema",
			why:  "the schema validates; it talks to no API server",
			deny: func(d string) bool { return under(d, clientGo, controllerRT, self("compiler"), self("internal")) },
			want: cue + "/go/cue",
		},
		{
			pkg:  "schema/yamlscan",
			why:  "the compiler and the schema both read user YAML through it: the standard library and yaml.v3 only",
			deny: func(d string) bool { return !std(d) && d != self("schema/yamlscan") && d != "gopkg.in/yaml.v3" },
			want: "gopkg.in/yaml.v3",
		},
		{
			pkg: "internal/informer",
			why: "the informer layer keeps the controller's caches current and maps events to routes: internal/controller calls it, it never links the controller, the writer or CUE",
			deny: func(d string) bool {
				return d == self("schema") || under(d, self("internal/controller"), self("internal/sink"), cue)
			},
			want: clientGo + "/tools/cache",
		},
		{
			pkg: "internal/scaler",
			why: "scale to zero's rule and the scale subresource: the controller calls it; it never links the controller, the compiler, the writer or CUE",
			deny: func(d string) bool {
				return d == self("schema") || under(d, self("internal/controller"), self("compiler"), self("internal/sink"), cue)
			},
			want: self("internal/served"),
		},
		{
			pkg:  "schema/v1alpha1",
			why:  "the public API types need apimachinery only",
			deny: func(d string) bool { return under(d, clientGo, controllerRT, cue, self("compiler"), self("internal")) },
			want: "k8s.io/apimachinery/pkg/runtime",
		},
		{
			pkg: "internal/readiness",
			why: "the listener detector reads /proc only",
			deny: func(d string) bool {
				return under(d, "k8s.io", "sigs.k8s.io", cue) || (under(d, module) && d != self("internal/readiness"))
			},
			want: "bufio",
		},
		{
			pkg: "internal/cli",
			why: "the shared entry point of every binary, readyz included: flags, env, logging, signals only",
			deny: func(d string) bool {
				return under(d, "k8s.io", "sigs.k8s.io", cue) || (under(d, module) && d != self("internal/cli"))
			},
			want: "github.com/spf13/cobra",
		},
		{
			pkg:  "internal/readyz",
			why:  "the readyz sidecar needs no API server: no client-go",
			deny: func(d string) bool { return under(d, "k8s.io", "sigs.k8s.io", cue) || under(d, controlPlanePkgs...) },
			want: self("internal/readiness"),
		},
		{
			pkg:  "cmd/readyz",
			why:  "the readyz sidecar needs no API server: no client-go",
			deny: func(d string) bool { return under(d, clientGo, controllerRT, cue) || under(d, controlPlanePkgs...) },
			want: self("internal/readiness"),
		},
		{
			pkg:  "cmd/reload",
			why:  "sidecars stay small: client-go only, none of the control plane",
			deny: func(d string) bool { return under(d, controllerRT, cue) || under(d, controlPlanePkgs...) },
			want: "github.com/fsnotify/fsnotify",
		},
		{
			pkg: "cmd/hagate",
			why: "sidecars stay small: client-go only; of our packages only its own, the detector, the entry point, the rest-config helper and the build-info metric",
			deny: func(d string) bool {
				return under(d, controllerRT, cue) || under(d, module) && !slices.Contains(hagateSelf, d)
			},
			want: clientGo + "/tools/leaderelection",
		},
	}
}

// hagateSelf are the only packages of this module hagate links.
var hagateSelf = []string{self("cmd/hagate"), self("internal/hagate"), self("internal/readiness"), self("internal/cli"), self("internal/kubeclient"), self("internal/buildinfo")}

// compilerDeps is the compiler's whole non-standard dependency set.
var compilerDeps = []string{
	self("compiler"),
	self("schema/routespec"),
	self("internal/endpoints"),
	self("internal/peers"),  // the peers table format (dynamic peers); std only
	self("schema/yamlscan"), // the pre-scan of user YAML (size, encoding, depth) and repeated keys; std and yaml.v3 only
	"gopkg.in/yaml.v3",
	"go.yaml.in/yaml/v2",
	"sigs.k8s.io/yaml",
}

func TestImportRules(t *testing.T) {
	for _, r := range rules() {
		t.Run(path.Clean(r.pkg), func(t *testing.T) {
			ds := deps(t, r.pkg)
			if !slices.Contains(ds, r.want) {
				t.Fatalf("go list -deps %s lacks %s: the rule is not looking at the real graph", r.pkg, r.want)
			}
			for _, d := range ds {
				if r.deny(d) {
					t.Errorf("%s imports %s: %s", r.pkg, d, r.why)
				}
			}
		})
	}
}
