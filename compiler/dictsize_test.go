package compiler

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/modelsphere/autoconfig/schema"
)

// TestSharedDictSizeSchemaMatchesCompiler: the schema accepts exactly the
// shared_dict_size values the compiler renders (64k to 16g), at every
// boundary of every unit and at random sizes. The schema used to accept
// any 1-11 digits with a unit ("17g", "1"), which the compiler then
// refused: an accepted route that never rendered.
func TestSharedDictSizeSchemaMatchesCompiler(t *testing.T) {
	v, err := schema.Default()
	if err != nil {
		t.Fatal(err)
	}
	var sizes []string
	for unit, max := range map[string]int64{"": 17179869184, "k": 16777216, "m": 16384, "g": 1} {
		for _, n := range []int64{0, 1, 7, 8, 9, 10, 63, 64, 65, 99, 100, 8191, 8192, 8193, 9999, 10000, 65535, 65536, 65537, 99999, 100000, max - 1, max, max + 1, max * 10, 99999999999} {
			sizes = append(sizes, strconv.FormatInt(n, 10)+unit)
		}
	}
	r := rand.New(rand.NewPCG(7, 7))
	for range 300 {
		sizes = append(sizes, strconv.FormatInt(r.Int64N(20000000000), 10)+[]string{"", "k", "K", "m", "M", "g", "G"}[r.IntN(7)])
	}
	sizes = append(sizes, "08k", "064k", "1.5m", "", "k", "16G", "1g", "64K", "8k")
	for _, size := range sizes {
		src := fmt.Sprintf("apiVersion: routing.modelsphere.dev/v1alpha1\nkind: ModelRoute\nmetadata: {name: d, namespace: n}\nspec:\n  discovery: {service: s}\n  nginx:\n    outputConfigMap: c\n    peers: [{use: backend, priority: 2}]\n    values: {shared_dict_size: %q}\n", size)
		obj, vetErr := v.Validate("d.yaml", []byte(src))
		route := llmRoute("d", map[string]string{SharedDictSizeKey: size}, backendTier)
		_, compileErr := Compile(route, Snapshot{Backends: []Endpoint{{IP: "10.0.0.1", Port: 80}}}, Options{})
		if (vetErr == nil) != (compileErr == nil) {
			t.Errorf("shared_dict_size %q: vet %v, compile %v", size, vetErr, compileErr)
		}
		_ = obj
	}
}
