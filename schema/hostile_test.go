package schema_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/modelsphere/autoconfig/internal/testbin"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
	"github.com/modelsphere/autoconfig/schema/yamlscan"
)

const routeHead = "apiVersion: routing.modelsphere.dev/v1alpha1\nkind: ModelRoute\nmetadata: {name: qwen}\n"

// hostileShapes are 200 KB route files nested far deeper than a route
// needs, each with the line and column where the pre-scan refuses it.
func hostileShapes() []struct {
	name, src string
	line, col int
} {
	var keys strings.Builder
	keys.WriteString(routeHead + "spec:\n")
	for i := 1; keys.Len() < 200<<10; i++ {
		fmt.Fprintf(&keys, "%sk:\n", strings.Repeat(" ", i))
	}
	return []struct {
		name, src string
		line, col int
	}{
		{"flow-100000", routeHead + "spec: " + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + "\n", 4, 106},
		{"flow-maps-50000", routeHead + "spec: " + strings.Repeat("{a: ", 50000) + "1" + strings.Repeat("}", 50000) + "\n", 4, 403},
		{"compact-sequences-100000", routeHead + "spec:\n" + strings.Repeat("- ", 100000) + "x\n", 5, 201},
		{"block-keys", keys.String(), 104, 101},
	}
}

// allocated is the bytes f allocates (runtime.MemStats.TotalAlloc).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A 200 KB file nested 100,000 deep is refused at the line and column
// where it passes yamlscan.MaxDepth, before any YAML parser sees it: the
// parsers' cost grows with the square of the nesting (goccy/go-yaml, which
// locates syntax errors, allocated 14.7 GB on flow-100000).
func TestValidateStreamDeepNesting(t *testing.T) {
	v := mustValidator(t)
	for _, s := range hostileShapes() {
		t.Run(s.name, func(t *testing.T) {
			var docs []schema.Document
			n := allocated(func() { docs = v.ValidateStream("a.yaml", []byte(s.src)) })
			if len(docs) != 1 {
				t.Fatalf("%d documents, want 1", len(docs))
			}
			var inv *schema.InvalidError
			if !errors.As(docs[0].Err, &inv) || len(inv.Problems) != 1 {
				t.Fatalf("got %v, want one problem", docs[0].Err)
			}
			want := fmt.Sprintf("a.yaml:%d:%d: nesting deeper than 100 levels; a ModelRoute needs fewer than 15: is the file generated?", s.line, s.col)
			if got := inv.Problems[0].String(); got != want {
				t.Errorf("got  %s\nwant %s", got, want)
			}
			t.Logf("%d bytes: %d bytes allocated", len(s.src), n)
			if n > 8<<20 {
				t.Errorf("allocated %d bytes refusing a %d-byte file; the pre-scan keeps no more than a line", n, len(s.src))
			}
		})
	}
}

// BenchmarkValidateStreamHostile reports the time and memory of refusing
// the 200 KB nested files, and of a 200 KB file that is wide instead of
// deep (passed to the parsers and the schema).
func BenchmarkValidateStreamHostile(b *testing.B) {
	v := mustValidator(b)
	shapes := hostileShapes()
	for _, s := range append(shapes, struct {
		name, src string
		line, col int
	}{name: "wide-string", src: routeHead + "spec:\n  discovery: {service: qwen}\n  nginx: {outputConfigMap: conf, peers: [{use: backend}]}\n  note: \"" + strings.Repeat("[{", 100<<10) + "\"\n"}) {
		b.Run(s.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(s.src)))
			for b.Loop() {
				v.ValidateStream("a.yaml", []byte(s.src))
			}
		})
	}
}

// A file of 200 KB that is big but flat is not refused by the depth limit:
// it reaches the schema, which reports what is wrong with it.
func TestValidateStreamBigFlatFile(t *testing.T) {
	v := mustValidator(t)
	src := routeHead + "spec:\n  discovery: {service: qwen}\n  nginx: {outputConfigMap: conf, peers: [{use: backend}]}\n  note: \"" + strings.Repeat("[{", 100<<10) + "\" # " + strings.Repeat("[", 1000) + "\n"
	docs := v.ValidateStream("a.yaml", []byte(src))
	var inv *schema.InvalidError
	if len(docs) != 1 || !errors.As(docs[0].Err, &inv) {
		t.Fatalf("got %+v", docs)
	}
	if got := inv.Problems[0].String(); got != "a.yaml:7:3: spec.note: unknown field; remove it or check its spelling against the ModelRoute reference" {
		t.Errorf("got %s", got)
	}
}

func TestValidateStreamTooLarge(t *testing.T) {
	v := mustValidator(t)
	src := routeHead + "spec:\n  note: |\n" + strings.Repeat("    "+strings.Repeat("x", 95)+"\n", yamlscan.MaxBytes/100+1)
	docs := v.ValidateStream("a.yaml", []byte(src))
	var inv *schema.InvalidError
	if len(docs) != 1 || !errors.As(docs[0].Err, &inv) {
		t.Fatalf("got %+v", docs)
	}
	p := inv.Problems[0]
	// the line holding the first byte past the limit
	if p.Line != 1+strings.Count(src[:yamlscan.MaxBytes], "\n") || !strings.HasPrefix(p.Message, "the file is larger than 4 MiB, the limit for one YAML file") {
		t.Errorf("got %s", p)
	}
}

func TestValidateStreamNotUTF8(t *testing.T) {
	v := mustValidator(t)
	docs := v.ValidateStream("a.yaml", []byte(routeHead+"spec:\n  discovery: {service: \"q\xffwen\"}\n"))
	var syn *schema.SyntaxError
	if len(docs) != 1 || !errors.As(docs[0].Err, &syn) {
		t.Fatalf("got %+v", docs)
	}
	if want := "a.yaml:5:26: parse yaml: byte 0xff is not UTF-8: YAML files must be UTF-8 (or UTF-16 with a byte-order mark); save the file as UTF-8"; syn.Error() != want {
		t.Errorf("got  %s\nwant %s", syn, want)
	}
	// UTF-16 with a byte-order mark is YAML: scanned, parsed and valid
	u := []byte{0xff, 0xfe}
	for _, r := range routeHead + "spec:\n  discovery: {service: qwen}\n  nginx: {outputConfigMap: conf, peers: [{use: backend}]}\n" {
		u = append(u, byte(r), 0)
	}
	if docs := v.ValidateStream("a.yaml", u); len(docs) != 1 || docs[0].Err != nil {
		t.Errorf("UTF-16: %+v", docs)
	}
}

// A repeated mapping key is a problem at the repeat naming the first, with
// the same value (which CUE would accept) or another (which CUE would
// report as a conflict, misleadingly), in the document that holds it.
func TestValidateStreamDuplicateKeys(t *testing.T) {
	v := mustValidator(t)
	ok := routeHead + "spec:\n  discovery: {service: qwen}\n  nginx: {outputConfigMap: conf, peers: [{use: backend}]}\n"
	for _, c := range []struct {
		name, src string
		want      []string // the problems of each document, "" = valid
	}{
		{"same value", ok + "  discovery: {service: qwen}\n", []string{
			`a.yaml:7:3: spec.discovery: key "discovery" repeats the one on line 5: a mapping holds each key once; delete one of them`}},
		{"other value", ok + "  discovery: {service: other}\n", []string{
			`a.yaml:7:3: spec.discovery: key "discovery" repeats the one on line 5: a mapping holds each key once; delete one of them`}},
		{"in a list, on one line", strings.Replace(ok, "{use: backend}", "{use: backend, use: cart}", 1), []string{
			`a.yaml:6:57: spec.nginx.peers.0.use: key "use" repeats the one on line 6 (column 43): a mapping holds each key once; delete one of them`}},
		{"second document", ok + "---\n" + strings.Replace(ok, "metadata: {name: qwen}", "metadata: {name: b, name: b}", 1), []string{"",
			`a.yaml:10:21: metadata.name: key "name" repeats the one on line 10 (column 12): a mapping holds each key once; delete one of them`}},
		{"json", `{"apiVersion": "routing.modelsphere.dev/v1alpha1", "kind": "ModelRoute", "kind": "ModelRoute", "metadata": {"name": "a"}}`, []string{
			`a.yaml:1:74: kind: key "kind" repeats the one on line 1 (column 52): a mapping holds each key once; delete one of them`}},
		{"merge keys are no repeats", strings.Replace(ok, "  discovery: {service: qwen}\n", "  discovery:\n    <<: {service: qwen, port: 80}\n    port: 81\n", 1), []string{""}},
		{"other kinds are not checked", "apiVersion: v1\nkind: Service\nkind: Service\n---\n" + ok, []string{"", ""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			docs := v.ValidateStream("a.yaml", []byte(c.src))
			var got []string
			for _, d := range docs {
				var inv *schema.InvalidError
				switch {
				case d.Err == nil:
					got = append(got, "")
				case errors.As(d.Err, &inv):
					got = append(got, inv.Error())
				default:
					t.Fatalf("document at line %d: %v", d.Line, d.Err)
				}
			}
			if strings.Join(got, "\n--\n") != strings.Join(c.want, "\n--\n") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n--\n"), strings.Join(c.want, "\n--\n"))
			}
		})
	}
}

// The rule "each use may appear once" is linear in the peers: it was
// pairwise, with one error per earlier twin (300 peers of one use, a 5 KB
// file, allocated 950 MB in 47 s; now about 14 MB). A file's peers are
// bounded before the schema sees them (MaxPeerEntries); an object (the
// controller's ValidateObject) reaches the rule.
func TestPeersUseOnceLinear(t *testing.T) {
	v := mustValidator(t)
	r := &v1alpha1.ModelRoute{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.Group + "/v1alpha1", Kind: v1alpha1.Kind}, ObjectMeta: metav1.ObjectMeta{Name: "qwen"},
		Spec: v1alpha1.Spec{Discovery: v1alpha1.Discovery{Service: "qwen"}, Nginx: v1alpha1.Nginx{OutputConfigMap: "conf"}}}
	for range 300 {
		r.Spec.Nginx.Peers = append(r.Spec.Nginx.Peers, v1alpha1.Peer{Use: v1alpha1.UseBackend})
	}
	var err error
	n := allocated(func() { _, err = v.ValidateObject(r) })
	var inv *schema.InvalidError
	if !errors.As(err, &inv) {
		t.Fatalf("got %v", err)
	}
	found := false
	for _, p := range inv.Problems {
		found = found || (p.Path == "spec.nginx.peers.299.use" && p.Message == "each use may appear once; backend is listed twice")
	}
	if len(inv.Problems) != 299 || !found {
		t.Errorf("%d problems, want 299, spec.nginx.peers.299.use among them: %v", len(inv.Problems), inv.Problems[0])
	}
	t.Logf("300 peers: %d bytes allocated", n)
	if n > 200<<20 {
		t.Errorf("allocated %d bytes for 300 peers", n)
	}
}

// wideShapes are 200 KB route files that are flat but have one list or
// mapping of thousands of entries, each with where it is refused.
func wideShapes() []struct {
	name, src, want string
} {
	var peers, labels, nodes strings.Builder
	peers.WriteString(routeHead + "spec:\n  discovery: {service: qwen}\n  nginx:\n    outputConfigMap: conf\n    peers:\n")
	for peers.Len() < 200<<10 {
		peers.WriteString("    - {priority: 1}\n")
	}
	labels.WriteString("apiVersion: routing.modelsphere.dev/v1alpha1\nkind: ModelRoute\nmetadata:\n  name: qwen\n  labels:\n")
	for i := 0; labels.Len() < 200<<10; i++ {
		fmt.Fprintf(&labels, "    k%d: v\n", i)
	}
	nodes.WriteString(routeHead + "spec:\n  values:\n")
	for i := 0; nodes.Len() < 200<<10; i++ {
		fmt.Fprintf(&nodes, "    k%d: [a, b, c, d, e, f, g, h]\n", i)
	}
	return []struct{ name, src, want string }{
		{"peers", peers.String(), "a.yaml:1009:7: spec.nginx.peers: the list has 10232 entries, more than 1000, the limit for one list (it bounds the schema's work; a ModelRoute needs a handful): shorten it"},
		{"labels", labels.String(), "a.yaml:1006:5: metadata.labels: the mapping has 15416 keys, more than 1000, the limit for one mapping (it bounds the schema's work; a ModelRoute needs a few dozen): shorten it"},
		{"values", nodes.String(), "a.yaml:1006:5: spec.values: the mapping has 5717 keys, more than 1000, the limit for one mapping (it bounds the schema's work; a ModelRoute needs a few dozen): shorten it"},
	}
}

// A 200 KB route that is flat but wide is refused before the schema sees
// it, at the first entry past the limit: CUE's cost grows with every value
// (10,000 peers took 3.7 s and 420 MB to be refused, 20,000 labels 1.4 s
// and 190 MB).
func TestValidateStreamTooMany(t *testing.T) {
	v := mustValidator(t)
	for _, s := range wideShapes() {
		t.Run(s.name, func(t *testing.T) {
			var docs []schema.Document
			n := allocated(func() { docs = v.ValidateStream("a.yaml", []byte(s.src)) })
			var inv *schema.InvalidError
			if len(docs) != 1 || !errors.As(docs[0].Err, &inv) || len(inv.Problems) != 1 {
				t.Fatalf("got %+v, want one document with one problem", docs)
			}
			if got := inv.Problems[0].String(); got != s.want {
				t.Errorf("got  %s\nwant %s", got, s.want)
			}
			t.Logf("%d bytes: %d bytes allocated", len(s.src), n)
			if n > 100<<20 {
				t.Errorf("allocated %d bytes refusing a %d-byte file", n, len(s.src))
			}
		})
	}
}

// The node limit counts the whole document: many collections, each under
// the entry limit.
func TestValidateStreamTooManyNodes(t *testing.T) {
	v := mustValidator(t)
	var b strings.Builder
	b.WriteString(routeHead + "spec:\n")
	for i := 0; i < 800; i++ {
		fmt.Fprintf(&b, "  k%d: [a, b, c, d, e, f]\n", i)
	}
	docs := v.ValidateStream("a.yaml", []byte(b.String()))
	var inv *schema.InvalidError
	if len(docs) != 1 || !errors.As(docs[0].Err, &inv) || len(inv.Problems) != 1 {
		t.Fatalf("got %+v", docs)
	}
	if got, want := inv.Problems[0].String(), "the document has more than 5000 values"; !strings.Contains(got, want) || !strings.HasPrefix(got, "a.yaml:") {
		t.Errorf("got %s, want a.yaml:…: %s…", got, want)
	}
}

// Documents of other kinds are not bounded (vet skips them; a CRD has
// thousands of nodes), and a route just under the limits reaches the
// schema.
func TestValidateStreamTooManyOnlyRoutes(t *testing.T) {
	v := mustValidator(t)
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: big}\ndata:\n")
	for i := 0; i < 3000; i++ {
		fmt.Fprintf(&b, "  k%d: v\n", i)
	}
	b.WriteString("---\napiVersion: routing.modelsphere.dev/v1alpha1\nkind: ModelRoute\nmetadata:\n  name: qwen\n  labels:\n")
	for i := 0; i < 1000; i++ {
		fmt.Fprintf(&b, "    k%d: v\n", i)
	}
	b.WriteString("spec:\n  discovery: {service: qwen}\n  nginx: {outputConfigMap: conf, peers: [{use: backend}]}\n")
	docs := v.ValidateStream("a.yaml", []byte(b.String()))
	if len(docs) != 2 || docs[0].OtherKind != "v1 ConfigMap" || docs[1].Err != nil || docs[1].Route == nil {
		t.Fatalf("got %+v", docs)
	}
}

// BenchmarkValidateStreamWide reports the time and memory of refusing the
// 200 KB wide files, and of validating the most route documents a file may
// hold (MaxRoutes minimal routes).
func BenchmarkValidateStreamWide(b *testing.B) {
	v := mustValidator(b)
	shapes := append(wideShapes(), struct{ name, src, want string }{"routes-100", minimalRoutes(schema.MinFileRoutes), ""}, struct{ name, src, want string }{"routes-1300", minimalRoutes(1300), ""})
	for _, s := range shapes {
		b.Run(s.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(s.src)))
			for b.Loop() {
				v.ValidateStream("a.yaml", []byte(s.src))
			}
		})
	}
}

// minimalRoutes is n route documents of about 20 values each.
func minimalRoutes(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "---\napiVersion: routing.modelsphere.dev/v1alpha1\nkind: ModelRoute\nmetadata: {name: r%d}\nspec:\n  discovery: {service: qwen}\n  nginx: {outputConfigMap: conf, peers: [{use: backend}]}\n", i)
	}
	return b.String()
}

// The route documents of one file are bounded together, by the file's
// size: the schema spends about a millisecond on each, however small
// (1,138 minimal routes in 200 KB took 1.0 s, 29,000 documents `--- {}`
// 21 s). The document past FileBounds is refused at its line, before the
// schema sees any; a file within them is validated.
func TestValidateStreamTooManyRoutes(t *testing.T) {
	v := mustValidator(t)
	docs := v.ValidateStream("a.yaml", []byte(minimalRoutes(schema.MinFileRoutes)))
	if len(docs) != schema.MinFileRoutes || docs[0].Err != nil || docs[schema.MinFileRoutes-1].Route == nil {
		t.Fatalf("%d routes: got %d documents, the first %+v", schema.MinFileRoutes, len(docs), docs[0])
	}
	for name, src := range map[string]string{
		// documents that are not routes at all still cost the schema
		"empty mappings": strings.Repeat("--- {}\n", 29000),
		"scalars":        strings.Repeat("--- 1\n", 34000),
		// 1,300 minimal routes (236 KB): their values pass the limit
		// first (each peer counts as 40)
		"routes": minimalRoutes(1300),
	} {
		t.Run(name, func(t *testing.T) {
			var docs []schema.Document
			n := allocated(func() { docs = v.ValidateStream("a.yaml", []byte(src)) })
			var inv *schema.InvalidError
			if len(docs) != 1 || !errors.As(docs[0].Err, &inv) || len(inv.Problems) != 1 {
				t.Fatalf("got %d documents, want one with one problem", len(docs))
			}
			limit, _ := schema.FileBounds(len(src))
			want := fmt.Sprintf("this is ModelRoute document %d of the file, more than %d, the limit for a file of %d bytes (one route per 256 bytes", limit+1, limit, len(src))
			got := inv.Problems[0]
			if name == "routes" {
				if !strings.Contains(got.Message, fmt.Sprintf("the limit for a file of %d bytes", len(src))) {
					t.Errorf("got %s, want a limit for a file of %d bytes", got, len(src))
				}
			} else if !strings.HasPrefix(got.Message, want) || got.Line != docLine(src, limit+1) {
				t.Errorf("got %s\nwant a.yaml:%d:…: %s…", got, docLine(src, limit+1), want)
			}
			if n > 20<<20 {
				t.Errorf("allocated %d bytes refusing %d bytes", n, len(src))
			}
		})
	}
}

// Ordinary GitOps files are far inside the file's bounds: 79, 150 and
// 500 copies of the shipped sample route (64 values each; 79 were refused
// by a whole-file limit of 5,000 values), and routes read back from a
// cluster with their managedFields.
func TestValidateStreamManySampleRoutes(t *testing.T) {
	v := mustValidator(t)
	for _, n := range []int{79, 150, 500} {
		src := sampleRoutes(t, n, false)
		docs := v.ValidateStream("a.yaml", []byte(src))
		if len(docs) != n {
			t.Fatalf("%d sample routes: %d documents", n, len(docs))
		}
		for i, d := range docs {
			if d.Err != nil || d.Route == nil {
				t.Fatalf("%d sample routes: document %d: %v", n, i+1, d.Err)
			}
		}
	}
	src := sampleRoutes(t, 100, true)
	for i, d := range v.ValidateStream("a.yaml", []byte(src)) {
		if d.Err != nil || d.Route == nil {
			t.Fatalf("100 exported routes: document %d: %v", i+1, d.Err)
		}
	}
}

// sampleRoutes is n copies of deploy/samples/modelroute-llm.yaml, each
// with its own name; exported adds the managedFields, uid and status a
// `kubectl get -o yaml` prints.
func sampleRoutes(t testing.TB, n int, exported bool) string {
	t.Helper()
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	sample, err := os.ReadFile(filepath.Join(root, "deploy", "samples", "modelroute-llm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i := range n {
		doc := strings.Replace(string(sample), "  name: qwen\n", fmt.Sprintf("  name: qwen-%d\n", i), 1)
		if exported {
			doc = strings.Replace(doc, "  namespace: llm-route\n", "  namespace: llm-route\n"+exportedMeta, 1) + exportedStatus
		}
		b.WriteString("---\n" + doc)
	}
	return b.String()
}

// exportedMeta and exportedStatus are what a route read back from a
// cluster carries besides its spec (kubectl get mr -o yaml).
const exportedMeta = `  uid: 0d5bd2a6-3f0e-4cde-9d5e-8f7f3c2d1a10
  resourceVersion: "182733"
  generation: 3
  creationTimestamp: "2026-12-01T10:00:00Z"
  finalizers: [routing.modelsphere.dev/cleanup]
  managedFields:
  - apiVersion: routing.modelsphere.dev/v1alpha1
    fieldsType: FieldsV1
    fieldsV1:
      f:spec:
        .: {}
        f:discovery: {.: {}, f:service: {}}
        f:cart: {.: {}, f:maxLoad: {}, f:outputConfigMap: {}, f:service: {}}
        f:monitor: {.: {}, f:model: {}, f:outputConfigMap: {}}
        f:nginx:
          .: {}
          f:outputConfigMap: {}
          f:peers: {}
          f:route: {}
          f:service: {}
          f:values: {.: {}, f:default_max: {}, f:health_probe_path: {}}
        f:slo: {.: {}, f:decodeTokensPerSecond: {}, f:ttftMs: {}}
    manager: kubectl-client-side-apply
    operation: Update
    time: "2026-12-01T10:00:00Z"
  - apiVersion: routing.modelsphere.dev/v1alpha1
    fieldsType: FieldsV1
    fieldsV1:
      f:metadata: {f:finalizers: {.: {}, v:"routing.modelsphere.dev/cleanup": {}}}
    manager: autoconfig
    operation: Update
    time: "2026-12-01T10:00:01Z"
  - apiVersion: routing.modelsphere.dev/v1alpha1
    fieldsType: FieldsV1
    fieldsV1:
      f:status:
        .: {}
        f:backends: {}
        f:conditions:
          .: {}
          k:{"type":"Ready"}: {.: {}, f:lastTransitionTime: {}, f:message: {}, f:observedGeneration: {}, f:reason: {}, f:status: {}, f:type: {}}
        f:observedGeneration: {}
    manager: autoconfig
    operation: Update
    subresource: status
    time: "2026-12-01T10:00:02Z"
`

const exportedStatus = `status:
  backends: 3
  observedGeneration: 3
  conditions:
  - {type: Ready, status: "True", reason: Reconciled, message: every output holds the current rendering, observedGeneration: 3, lastTransitionTime: "2026-12-01T10:00:02Z"}
`

// docLine is the line of the first value of document n (1-based) of a
// file of documents that each start with "---" (on its own line or
// followed by the value).
func docLine(src string, n int) int {
	line := 1
	for i, l := range strings.Split(src, "\n") {
		if strings.HasPrefix(l, "---") {
			if n--; n == 0 {
				line = i + 1
				if l == "---" {
					line++
				}
				break
			}
		}
	}
	return line
}

// The values of a file's route documents are bounded together too, by
// the file's size, a peer counting as PeerValues more (about 0.16 ms
// each: 12 documents of 999 peers took 2 s and 107 MB).
func TestValidateStreamTooManyFileValues(t *testing.T) {
	v := mustValidator(t)
	var b strings.Builder
	for i := range 12 {
		fmt.Fprintf(&b, "---\napiVersion: routing.modelsphere.dev/v1alpha1\nkind: ModelRoute\nmetadata: {name: p%d}\nspec:\n  discovery: {service: qwen}\n  nginx:\n    outputConfigMap: conf\n    peers: [%s{use: backend}]\n", i, strings.Repeat("{use: backend}, ", 998))
	}
	src := b.String()
	var docs []schema.Document
	n := allocated(func() { docs = v.ValidateStream("a.yaml", []byte(src)) })
	var inv *schema.InvalidError
	if len(docs) != 1 || !errors.As(docs[0].Err, &inv) || len(inv.Problems) != 1 {
		t.Fatalf("got %d documents, want one with one problem", len(docs))
	}
	// About 3,000 nodes and 999 peers a document (43,000 values): the
	// second passes the limit of a 190 KB file.
	_, limit := schema.FileBounds(len(src))
	want := fmt.Sprintf("a.yaml:%d:1: with this document the file's ModelRoute documents have ", docLine(src, 2))
	more := fmt.Sprintf(" values (a peer counts as 40), more than %d, the limit for a file of %d bytes", limit, len(src))
	if got := inv.Problems[0].String(); !strings.HasPrefix(got, want) || !strings.Contains(got, more) {
		t.Errorf("got  %s\nwant %s…%s…", got, want, more)
	}
	if n > 20<<20 {
		t.Errorf("allocated %d bytes refusing %d bytes", n, len(src))
	}

	// Documents of four lists of 999 one-letter values (4,000 values in
	// 8 KB, within one document's bounds): the file's values pass
	// FileBounds at the ninth.
	b.Reset()
	list := "[" + strings.Repeat("a,", 998) + "a]"
	for i := range 12 {
		fmt.Fprintf(&b, "---\napiVersion: routing.modelsphere.dev/v1alpha1\nkind: ModelRoute\nmetadata: {name: l%d}\nspec:\n", i)
		for j := range 4 {
			fmt.Fprintf(&b, "  x%d: %s\n", j, list)
		}
	}
	src = b.String()
	docs = v.ValidateStream("a.yaml", []byte(src))
	if len(docs) != 1 || !errors.As(docs[0].Err, &inv) || len(inv.Problems) != 1 {
		t.Fatalf("got %d documents, want one with one problem", len(docs))
	}
	_, limit = schema.FileBounds(len(src))
	perDoc := 4016 // four lists of 999 (each with its key) and the document around them
	k := limit/perDoc + 1
	want = fmt.Sprintf("a.yaml:%d:1: with this document the file's ModelRoute documents have %d values (a peer counts as 40), more than %d, the limit for a file of %d bytes", docLine(src, k), k*perDoc, limit, len(src))
	if got := inv.Problems[0].String(); !strings.HasPrefix(got, want) {
		t.Errorf("got  %s\nwant %s…", got, want)
	}
}

// An alias counts as the values it repeats: 999 aliases of one peer of 46
// fields, a 3.5 KB file, were 46,000 values for CUE (9 s, 470 MB and 6 MB
// of problems). It is refused at the alias that passes the limit.
func TestValidateStreamTooManyAliases(t *testing.T) {
	v := mustValidator(t)
	var fields []string
	for j := range 45 {
		fields = append(fields, fmt.Sprintf("x%d: v", j))
	}
	src := routeHead + "spec:\n  discovery: {service: qwen}\n  x: &p {use: backend, " + strings.Join(fields, ", ") + "}\n  nginx:\n    outputConfigMap: conf\n    peers: [" + strings.TrimSuffix(strings.Repeat("*p, ", 999), ", ") + "]\n"
	var docs []schema.Document
	n := allocated(func() { docs = v.ValidateStream("a.yaml", []byte(src)) })
	var inv *schema.InvalidError
	if len(docs) != 1 || !errors.As(docs[0].Err, &inv) || len(inv.Problems) != 1 {
		t.Fatalf("got %d documents, want one with one problem", len(docs))
	}
	// the peer is 93 values: the 53rd alias passes 5,000
	want := "a.yaml:9:221: the document has more than 5000 values, counting what its aliases repeat, the limit for one document"
	if got := inv.Problems[0].String(); !strings.HasPrefix(got, want) {
		t.Errorf("got  %s\nwant %s…", got, want)
	}
	if n > 20<<20 {
		t.Errorf("allocated %d bytes refusing %d bytes", n, len(src))
	}
}

// A document that is not a mapping gets one short problem, not the
// schema's "conflicting values 1 and {…}" with the whole definition in it
// (14 KB a document).
func TestValidateStreamNotMapping(t *testing.T) {
	v := mustValidator(t)
	docs := v.ValidateStream("a.yaml", []byte("--- 1\n--- [a, b]\n--- \""+strings.Repeat("x", 100)+"\"\n"))
	want := []string{
		"a.yaml:1:5: a ModelRoute document is a mapping of fields (apiVersion, kind, metadata, spec), not 1",
		"a.yaml:2:5: a ModelRoute document is a mapping of fields (apiVersion, kind, metadata, spec), not a list",
		"a.yaml:3:5: a ModelRoute document is a mapping of fields (apiVersion, kind, metadata, spec), not \"" + strings.Repeat("x", 39) + "…",
	}
	if len(docs) != len(want) {
		t.Fatalf("got %d documents, want %d", len(docs), len(want))
	}
	for i, d := range docs {
		if d.Err == nil || d.Err.Error() != want[i] {
			t.Errorf("document %d: got %v\nwant %s", i+1, d.Err, want[i])
		}
	}
}

// A syntax error in a large file is located by the second parser in the
// documents around it only: goccy/go-yaml allocates 200-550 bytes per byte
// it is given (106 MB for the whole of a 200 KB file of nested lists, 143
// MB resident). The line and column stay exact.
func TestSyntaxErrorLargeFile(t *testing.T) {
	v := mustValidator(t)
	var b strings.Builder
	for i := 0; b.Len() < 200<<10; i++ {
		fmt.Fprintf(&b, "--- {apiVersion: v1, kind: ConfigMap, data: %s%d%s}\n", strings.Repeat("[", 40), i, strings.Repeat("]", 40))
	}
	lines := strings.Count(b.String(), "\n")
	b.WriteString("---\napiVersion: v1\nkind: ConfigMap\ndata:\n  a: b\n\tc: d\n")
	src := b.String()
	var docs []schema.Document
	n := allocated(func() { docs = v.ValidateStream("a.yaml", []byte(src)) })
	last := docs[len(docs)-1]
	var syn *schema.SyntaxError
	if !errors.As(last.Err, &syn) {
		t.Fatalf("the last document: got %v, want a syntax error", last.Err)
	}
	if want := fmt.Sprintf("a.yaml:%d:1: parse yaml: found character '\t' that cannot start any token", lines+6); syn.Error() != want {
		t.Errorf("got  %s\nwant %s", syn, want)
	}
	t.Logf("%d bytes: %d bytes allocated", len(src), n)
	if n > 70<<20 {
		t.Errorf("allocated %d bytes for a %d-byte file", n, len(src))
	}
}

// A JSON route holding U+FFFE raw (kubectl get -o json may) is bounded
// like any other: yaml.v3, which counts, refused the raw character, and
// 8,000 peers reached the schema (2.3 s and 358 MB).
func TestValidateStreamTooManyJSON(t *testing.T) {
	v := mustValidator(t)
	src := `{"apiVersion": "routing.modelsphere.dev/v1alpha1", "kind": "ModelRoute", "metadata": {"name": "j", "labels": {"a": "` + "\ufffe" + `"}}, "spec": {"discovery": {"service": "q"}, "nginx": {"outputConfigMap": "c", "peers": [` + strings.TrimSuffix(strings.Repeat(`{"use": "backend"}, `, 8000), ", ") + `]}}}`
	var docs []schema.Document
	n := allocated(func() { docs = v.ValidateStream("a.json", []byte(src)) })
	var inv *schema.InvalidError
	if len(docs) != 1 || !errors.As(docs[0].Err, &inv) || len(inv.Problems) != 1 {
		t.Fatalf("got %d documents, want one with one problem", len(docs))
	}
	if got, want := inv.Problems[0].String(), "spec.nginx.peers: the list has 8000 entries, more than 1000, the limit for one list"; !strings.Contains(got, want) {
		t.Errorf("got  %s\nwant …%s…", got, want)
	}
	if n > 20<<20 {
		t.Errorf("allocated %d bytes refusing %d bytes", n, len(src))
	}
}

// fill200KB is the documents doc(0), doc(1), … up to 200 KB, as many as
// the file's bounds let through (the largest file of the shape that the
// schema validates rather than refuses).
func fill200KB(doc func(i int) string) string {
	var docs []string
	for n := 0; n < 200<<10; {
		d := "---\n" + doc(len(docs))
		docs = append(docs, d)
		n += len(d)
	}
	lo, hi := 0, len(docs) // docs[:lo] pass, docs[:hi+1] not known
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if schema.RefusedForSize([]byte(strings.Join(docs[:mid], ""))) {
			hi = mid - 1
		} else {
			lo = mid
		}
	}
	return strings.Join(docs[:lo], "")
}

// within200KB are 200 KB files of documents that each pass one
// document's bounds, the costliest shapes for the schema per byte: the
// file's bounds (FileBounds, MaxPeerEntries) keep each within about a
// second (BenchmarkValidateStream200KB).
func within200KB(t testing.TB) map[string]string {
	head := func(i int) string {
		return fmt.Sprintf("apiVersion: routing.modelsphere.dev/v1alpha1\nkind: ModelRoute\nmetadata:\n  name: r%d\n", i)
	}
	rows := func(n int, row string) string { return strings.Repeat(row, n) }
	return map[string]string{
		"minimal": fill200KB(func(i int) string { return minimalRoutes(1)[4:] }),
		"minimal-padded": fill200KB(func(i int) string {
			r := minimalRoutes(1)[4:]
			return r + "#" + strings.Repeat("x", schema.RouteBytes-len(r)-6) + "\n"
		}),
		"empty-mappings": strings.Repeat("--- {}\n", 200<<10/7),
		"samples":        sampleRoutes(t, 150, false),
		"exported":       sampleRoutes(t, 40, true),
		"peers-16": fill200KB(func(i int) string {
			return head(i) + "spec:\n  discovery: {service: qwen}\n  nginx:\n    outputConfigMap: conf\n    peers:\n" + rows(16, "    - {use: backend}\n")
		}),
		"labels-999":      fill200KB(func(i int) string { return head(i) + "  labels:\n" + rows(999, "    k: v\n") }),
		"values-999":      fill200KB(func(i int) string { return head(i) + "spec:\n  nginx:\n    values:\n" + rows(999, "      k: v\n") }),
		"unknown-lists-4": fill200KB(func(i int) string { return head(i) + "spec:\n" + rows(4, "  x: ["+strings.Repeat("a,", 998)+"a]\n") }),
	}
}

// BenchmarkValidateStream200KB: the schema's time and memory on 200 KB
// files of the costliest shapes within the bounds.
func BenchmarkValidateStream200KB(b *testing.B) {
	v := mustValidator(b)
	for name, src := range within200KB(b) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				v.ValidateStream("a.yaml", []byte(src))
			}
		})
	}
}
