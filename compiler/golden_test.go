package compiler

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/schema"
)

// TestGolden compiles every valid route (deploy/samples and
// testdata/routes/valid) against testdata/snapshots/default.yaml and the
// CART base testdata/snapshots/cart-base.yaml, and compares the outputs with
// testdata/golden/<dir>/<route>.txt. The goldens pin the rendered bytes: an
// upgrade that changes them reloads every consumer. Update with
//
//	AUTOCONFIG_UPDATE=1 go test -run TestGolden ./compiler
func TestGolden(t *testing.T) {
	root, routes, rels, snap, base := goldenInputs(t)
	for _, rel := range rels {
		golden := filepath.Join(root, "testdata", "golden", filepath.Base(filepath.Dir(rel)), strings.TrimSuffix(filepath.Base(rel), ".yaml")+".txt")
		t.Run(rel, func(t *testing.T) {
			route := routes[rel]
			got := renderGolden(t, rel, route, snap, base)
			// Compiling again gives the same bytes.
			res, _ := Compile(route, snap, Options{})
			res2, _ := Compile(route, snap, Options{})
			for i, o := range res2.Outputs {
				a, _ := o.Render(base)
				b, _ := res.Outputs[i].Render(base)
				if !bytes.Equal(a, b) {
					t.Fatalf("%s: second compile differs", o.Key)
				}
			}
			checkGolden(t, golden, got, "TestGolden")
		})
	}
}

// checkGolden compares got with the golden file, or rewrites the file when
// AUTOCONFIG_UPDATE=1; test names the test that rewrites it.
func checkGolden(t *testing.T, golden string, got []byte, test string) {
	t.Helper()
	if os.Getenv("AUTOCONFIG_UPDATE") == "1" {
		if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("no golden (run AUTOCONFIG_UPDATE=1 go test -run %s ./compiler): %v", test, err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("differs from %s (AUTOCONFIG_UPDATE=1 rewrites it):\n%s", golden, got)
	}
}

// TestNginxLoadsValidRoutes installs every valid route's file into one real
// nginx (routes sharing one http{}: zone, map and upstream names must not
// collide) and checks each route answers through the dispatch server.
// Corpus files that use the same route name are loaded in later rounds, so
// every file is loaded once.
func TestNginxLoadsValidRoutes(t *testing.T) {
	root := testbin.Root(t)
	v, err := schema.Default()
	if err != nil {
		t.Fatal(err)
	}
	n := startNginx(t)
	be := newBackend(t, text("ok"))
	snap := Snapshot{Backends: []Endpoint{be.endpoint(t)}, BackendService: be.vip(t), CartService: be.vip(t)}
	var files []string
	for _, dir := range []string{"deploy/samples", "testdata/routes/valid"} {
		m, _ := filepath.Glob(filepath.Join(root, dir, "*.yaml"))
		files = append(files, m...)
	}
	for round := 1; len(files) > 0; round++ {
		routes := map[string]string{} // route name → file
		var later []string
		for _, f := range files {
			route := validRoute(t, v, f, f)
			name := RouteName(route)
			if _, ok := routes[name]; ok {
				later = append(later, f)
				continue
			}
			routes[name] = f
			res, err := Compile(route, snap, Options{SockDir: n.SockDir()})
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			conf, _ := res.Outputs[0].Render(nil)
			if err := os.WriteFile(filepath.Join(n.RoutesDir(), res.Outputs[0].Key), conf, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := n.Test(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if err := n.Reload(); err != nil {
			t.Fatalf("round %d: %v\n%s", round, err, tail(n.ErrorLog(), 3000))
		}
		for name, f := range routes {
			// The public download path needs no key on any video route with
			// the default auth_public_paths; llm routes go through the reference engine.
			code, body, _ := do(t, nil, "GET", n.URL(name)+"v2/video_generation/id/content", nil, "")
			if code != 200 && code != 401 {
				t.Errorf("%s: route %s: %d %q", f, name, code, body)
			}
		}
		files = later
	}
}
