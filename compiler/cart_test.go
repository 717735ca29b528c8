package compiler

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// yamlCartConfig is RenderCartConfig printed by yaml.v3 alone, node tree
// and all: the reference the spliced workers must match byte for byte.
func yamlCartConfig(t *testing.T, base []byte, workers []CartWorker, owner string) []byte {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal(base, &doc); err != nil {
		t.Fatal(err)
	}
	b, err := encodeCart(&doc, workers, "ns/cart", owner)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRenderCartConfigSplice checks that the workers written without
// yaml.v3 (spliced between the lines it prints for the rest) are the bytes
// yaml.v3 prints, for bases of every layout (comments around and inside the
// list, no workers key, a nested workers key, a placeholder URL already in
// the base), IPv4 and IPv6 URLs, and URLs yaml.v3 quotes (printed by
// yaml.v3 itself).
func TestRenderCartConfigSplice(t *testing.T) {
	chart, err := os.ReadFile("../testdata/snapshots/cart-base.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bases := map[string]string{
		"chart":        string(chart),
		"flow":         cartBase,
		"no workers":   "server:\n  port: 1\n",
		"only workers": "workers: []\n",
		"comments": "# top\nworkers:\n# head of the list\n- url: http://old:1 # line\n  max_load: 3\n# foot of the list\n\n" +
			"# before policy\npolicy: x # after\n",
		"marked":      "# " + ownerMark(cartMarkKey, "ns/other") + "\nworkers: [{url: a, max_load: 1}]\n",
		"indented":    "server:\n    port: 1\nworkers:\n    -   url: http://a:1\n        max_load: 1\n",
		"nested":      "a:\n  workers: []\nb: [1, 2]\n",
		"last":        "a: 1\nworkers:\n- url: x\n  max_load: 1",
		"document":    "%YAML 1.1\n---\nworkers: []\n...\n",
		"placeholder": "# " + cartPlaceholders[0].URL + "\nworkers: []\n",
		"anchors":     "x: &w [1]\nworkers: *w\ny: *w\n",
		"long key":    strings.Repeat("k", 200) + ": " + strings.Repeat("v ", 100) + "\nworkers: []\n",
	}
	v4 := []CartWorker{{URL: "http://10.0.0.1:8000", MaxLoad: 20}}
	mixed := []CartWorker{
		{URL: "http://10.0.0.1:8000", MaxLoad: 20}, {URL: "http://255.255.255.255:65535", MaxLoad: 0},
		{URL: "http://[fd00::1]:8000", MaxLoad: -1}, {URL: "http://[::]:1", MaxLoad: 2147483647},
		{URL: "http://[1::]:80", MaxLoad: 5}, {URL: "http://[::ffff:1.2.3.4]:80", MaxLoad: 5},
		{URL: "http://[2001:DB8:0:0:0:0:0:1]:443", MaxLoad: -2147483648},
	}
	var many []CartWorker
	for i := range 300 {
		many = append(many, CartWorker{URL: fmt.Sprintf("http://10.1.%d.%d:8000", i/256, i%256), MaxLoad: 20})
	}
	quoted := []CartWorker{
		{URL: "http://10.0.0.1:8000", MaxLoad: 1}, {URL: "http://a b:80 #x", MaxLoad: 1}, {URL: "", MaxLoad: 1},
		{URL: "http://1.2.3.4:", MaxLoad: 1}, {URL: "true", MaxLoad: 1}, {URL: "http://é:1", MaxLoad: 1},
		{URL: "http://x:1\nmax_load: 2", MaxLoad: 1}, {URL: "http://" + strings.Repeat("a ", 60) + ":1", MaxLoad: 1},
	}
	lists := map[string][]CartWorker{"none": nil, "one": v4, "mixed": mixed, "many": many, "quoted": quoted}
	for bn, base := range bases {
		// Every base but the one holding a placeholder takes the splice.
		placeholders := yamlCartConfig(t, []byte(base), cartPlaceholders[:], "")
		if _, ok := spliceWorkers(placeholders, v4); ok != (bn != "placeholder") {
			t.Errorf("%s base: spliced %v:\n%s", bn, ok, placeholders)
		}
		for ln, workers := range lists {
			for _, owner := range []string{"", "llm-route/qwen"} {
				got, err := RenderCartConfig([]byte(base), workers, "ns/cart", owner)
				if err != nil {
					t.Fatalf("%s/%s/%q: %v", bn, ln, owner, err)
				}
				if want := yamlCartConfig(t, []byte(base), workers, owner); !bytes.Equal(got, want) {
					t.Errorf("%s base, %s workers, owner %q: got\n%s\nwant (yaml.v3)\n%s", bn, ln, owner, got, want)
				}
			}
		}
	}
}

// TestRenderCartConfigCost bounds the allocations of rewriting the CART
// config for 5,000 backends (the controller does it on every endpoint
// change): yaml.v3 printing a node tree per worker took 14 allocations and
// 9 KB a worker, the spliced workers take a constant number of
// allocations and about the output's size.
func TestRenderCartConfigCost(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation count")
	}
	const n = 5000
	res, err := Compile(benchLLMRoute(), benchSnapshot(n), Options{})
	if err != nil {
		t.Fatal(err)
	}
	render := res.Outputs[1].Render
	if res.Outputs[1].Key != CartKey {
		t.Fatalf("output 1 is %s", res.Outputs[1].Key)
	}
	base := []byte(cartBase)
	out, err := render(base)
	if err != nil {
		t.Fatal(err)
	}
	if allocs := testing.AllocsPerRun(3, func() { render(base) }); allocs > 500 {
		t.Errorf("%d workers: %.0f allocations a render, want at most 500 (not one a worker)", n, allocs)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const runs = 3
	for range runs {
		render(base)
	}
	runtime.ReadMemStats(&after)
	if bytes, limit := (after.TotalAlloc-before.TotalAlloc)/runs, uint64(4*len(out)+256<<10); bytes > limit {
		t.Errorf("%d workers: %d bytes allocated a render (output %d bytes), want at most %d", n, bytes, len(out), limit)
	}
}
