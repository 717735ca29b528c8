package compiler

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// TestScaleToZeroAtZero: a route with spec.scaleToZero and no backend
// endpoint renders a route without tiers whose engine holds
// (hold_timeout), static and with dynamic peers, llm and video, and says
// so (Result.ScaledToZero); the same route without spec.scaleToZero
// still fails with ErrNoBackends, so nothing empty is written for it.
// Goldens: testdata/golden/zero/<route>[.dynamic].txt.
func TestScaleToZeroAtZero(t *testing.T) {
	root, routes, _, snap, base := goldenInputs(t)
	zero := snap
	zero.Backends, zero.CartPods = nil, nil
	for _, rel := range []string{"testdata/routes/valid/scale-to-zero.yaml", "testdata/routes/valid/scale-to-zero-defaults.yaml", "testdata/routes/valid/scale-to-zero-limits.yaml"} {
		route := routes[rel]
		if route == nil || route.Spec.ScaleToZero == nil {
			t.Fatalf("%s: not a scale-to-zero route in the corpus", rel)
		}
		name := strings.TrimSuffix(filepath.Base(rel), ".yaml")
		for _, dyn := range []bool{false, true} {
			suffix := ""
			if dyn {
				suffix = ".dynamic"
			}
			t.Run(name+suffix, func(t *testing.T) {
				res, err := Compile(route, zero, Options{DynamicPeers: dyn})
				if err != nil {
					t.Fatalf("compile at zero: %v", err)
				}
				if !res.ScaledToZero {
					t.Error("Result.ScaledToZero is false at zero endpoints")
				}
				got := renderOutputs(t, "# "+rel+" compiled at zero backends\n", res, base)
				out := string(got)
				if !strings.Contains(out, `[ "hold_timeout" ] = "`) {
					t.Error("the route file has no hold_timeout option")
				}
				for _, ip := range []string{"10.0.0.3", "10.96.0.10"} {
					if strings.Contains(out, ip) {
						t.Errorf("a tier at zero names %s (a dead or VIP peer): the engine must hold instead", ip)
					}
				}
				checkGolden(t, filepath.Join(root, "testdata", "golden", "zero", name+suffix+".txt"), got, "TestScaleToZeroAtZero")

				// Without spec.scaleToZero: the fail-safe stays.
				plain := clone(route)
				plain.Spec.ScaleToZero = nil
				if _, err := Compile(plain, zero, Options{DynamicPeers: dyn}); !errors.Is(err, ErrNoBackends) {
					t.Errorf("without scaleToZero at zero: %v, want ErrNoBackends", err)
				}
			})
		}
	}
}

// TestScaleToZeroHoldSeconds: the hold option is holdTimeout in whole
// seconds (default 300s), rendered only for a scale-to-zero route.
func TestScaleToZeroHoldSeconds(t *testing.T) {
	_, routes, _, snap, _ := goldenInputs(t)
	for rel, want := range map[string]string{
		"testdata/routes/valid/scale-to-zero.yaml":          `[ "hold_timeout" ] = "600"`,
		"testdata/routes/valid/scale-to-zero-defaults.yaml": `[ "hold_timeout" ] = "300"`,
		"testdata/routes/valid/scale-to-zero-limits.yaml":   `[ "hold_timeout" ] = "3600"`,
	} {
		res, err := Compile(routes[rel], snap, Options{})
		if err != nil {
			t.Fatal(err)
		}
		conf, _ := res.Outputs[0].Render(nil)
		if !bytes.Contains(conf, []byte(want)) {
			t.Errorf("%s: no %s in\n%s", rel, want, conf)
		}
		if res.ScaledToZero {
			t.Errorf("%s: ScaledToZero with backends", rel)
		}
	}
	for rel, r := range routes {
		if r.Spec.ScaleToZero != nil {
			continue
		}
		res, err := Compile(r, snap, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range res.Outputs {
			data, _ := o.Render(nil)
			if bytes.Contains(data, []byte("hold_timeout")) {
				t.Errorf("%s: %s renders hold_timeout without spec.scaleToZero", rel, o.Key)
			}
		}
	}
}
