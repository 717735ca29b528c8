package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportGraph keeps the sidecar small: client-go only, no CUE, no
// controller-runtime, none of the controller's packages. Test files are
// not part of the binary's graph, so envtest there is fine.
func TestImportGraph(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	const self = "github.com/modelsphere/autoconfig/"
	allowed := map[string]bool{
		self + "cmd/hagate":          true,
		self + "internal/hagate":     true,
		self + "internal/readiness":  true,
		self + "internal/cli":        true,
		self + "internal/kubeclient": true,
	}
	var sawClientGo bool
	for _, p := range strings.Fields(string(out)) {
		switch {
		case strings.HasPrefix(p, "cuelang.org/"), strings.HasPrefix(p, "sigs.k8s.io/controller-runtime"):
			t.Errorf("hagate imports %s", p)
		case strings.HasPrefix(p, self) && !allowed[p]:
			t.Errorf("hagate imports %s; only %v are expected", p, allowed)
		case p == "k8s.io/client-go/tools/leaderelection":
			sawClientGo = true
		}
	}
	if !sawClientGo {
		t.Error("go list -deps output does not include client-go's leaderelection: the check is not looking at hagate")
	}
}
