package schema_test

import (
	"fmt"
	"os"
	"path"
	"strings"
	"sync"
	"testing"

	"github.com/modelsphere/autoconfig/internal/testbin"
)

func benchRoutes(tb testing.TB) map[string][]byte {
	tb.Helper()
	video, err := os.ReadFile("../testdata/routes/valid/video-defaults.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	small, err := os.ReadFile("../testdata/routes/valid/llm-minimal-selector.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("apiVersion: routing.modelsphere.dev/v1alpha1\nkind: ModelRoute\nmetadata: {name: many}\nspec:\n  discovery: {service: many}\n  nginx:\n    outputConfigMap: conf\n    peers: [{use: backend}]\n    values:\n")
	for i := range 50 {
		fmt.Fprintf(&b, "      opt_%02d: \"value %d\"\n", i, i)
	}
	return map[string][]byte{"small-llm": small, "video-defaults": video, "values-50": []byte(b.String())}
}

// BenchmarkValidate measures validate + default + decode of one route with
// the process-wide compiled schema.
func BenchmarkValidate(b *testing.B) {
	v := mustValidator(b)
	for _, name := range []string{"small-llm", "video-defaults", "values-50"} {
		src := benchRoutes(b)[name]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Validate(name, src); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkValidateInvalid measures vet's work on invalid routes: every
// problem of the document found and located.
func BenchmarkValidateInvalid(b *testing.B) {
	v := mustValidator(b)
	for _, name := range []string{"invalid/unknown-spec-field.yaml", "invalid/several/seven-independent.yaml", "invalid/several/peers.yaml", "invalid/several/video.yaml"} {
		src, err := os.ReadFile("../testdata/routes/" + name)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(strings.TrimSuffix(path.Base(name), ".yaml"), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Validate(name, src); err == nil {
					b.Fatal("invalid route accepted")
				}
			}
		})
	}
}

// TestValidateConcurrent validates from several goroutines at once (run
// under -race in make test): the shared Validator must be safe and give
// every caller the same result.
func TestValidateConcurrent(t *testing.T) {
	v := mustValidator(t)
	routes := benchRoutes(t)
	bad, err := os.ReadFile("../testdata/routes/invalid/video-with-cart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				for name, src := range routes {
					r, err := v.Validate(name, src)
					if err != nil {
						errs <- fmt.Errorf("goroutine %d: %s: %v", g, name, err)
						return
					}
					if r.Spec.Nginx.Route == "" {
						errs <- fmt.Errorf("goroutine %d: %s: route not defaulted", g, name)
					}
				}
				if _, err := v.Validate("bad", bad); err == nil || !strings.Contains(err.Error(), "video routes cannot use cart") {
					errs <- fmt.Errorf("goroutine %d round %d: bad route: %v", g, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestValidateObjectMemoryFlat validates many generations of a route
// object, as the controller does for the life of the process, and checks the
// heap does not grow with the number of validations (CompileBytes on a
// long-lived context kept ≈ 20 KB per call; BuildExpr stays flat).
func TestValidateObjectMemoryFlat(t *testing.T) {
	v := mustValidator(t)
	src := benchRoutes(t)["small-llm"]
	r, err := v.Validate("r", src)
	if err != nil {
		t.Fatal(err)
	}
	run := func(n int) {
		for i := range n {
			r.Generation = int64(i)
			if _, err := v.ValidateObject(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	run(200) // warm up caches
	before := testbin.HeapAfterGC()
	run(2000)
	grown := testbin.HeapAfterGC() - before
	// 2000 leaked files of ≈ 20 KB would be ≈ 40 MB; allow noise well below.
	if grown > 8<<20 {
		t.Fatalf("heap grew by %d bytes over 2000 validations: something keeps every document", grown)
	}
}
