package crdgen_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/modelsphere/autoconfig/internal/celcheck"
	"github.com/modelsphere/autoconfig/internal/crdgen"
	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/internal/testenv"
	"github.com/modelsphere/autoconfig/schema"
)

// knownGaps lists corpus documents ("file#doc") on which CUE and the
// Kubernetes judges are known to disagree, with the reason. A listed
// document on which they agree fails the test, so the list cannot go
// stale. All but the bare-name monitor cases are a difference in how the
// document is read before any rule runs; those are the one CUE rule the
// CRD cannot express, because a CRD rule cannot read metadata.namespace
// (only metadata.name and generateName). The two Kubernetes judges
// (in-process and API server) must always agree.
var knownGaps = map[string]string{
	"testdata/routes/invalid/monitor-bare-is-nginx-configmap.yaml#0":       "the bare monitor ConfigMap resolves in metadata.namespace to the nginx one; CUE resolves it, a CRD rule cannot read metadata.namespace (the CRD compares the text; the controller, which validates with the namespace, marks the route InvalidSpec)",
	"testdata/routes/invalid/nginx-bare-is-monitor-configmap.yaml#0":       "the bare nginx ConfigMap resolves in metadata.namespace to the monitor one; CUE resolves it, a CRD rule cannot read metadata.namespace (the CRD compares the text; the controller, which validates with the namespace, marks the route InvalidSpec)",
	"internal/crdgen/testdata/routes/invalid/cart-null.yaml#0":             "the API server drops null values of non-nullable fields before validation (null = unset, as in kubectl apply); CUE rejects null for a struct",
	"internal/crdgen/testdata/routes/invalid/generate-name.yaml#0":         "the API server names the object from generateName; CUE requires metadata.name (nginx.route and monitor.model default to it)",
	"internal/crdgen/testdata/routes/invalid/include-not-ready-yes.yaml#0": "YAML 1.1 (kubectl, sigs.k8s.io/yaml) reads yes as true, YAML 1.2 (CUE) as the string \"yes\"; the API server receives JSON true",
	"internal/crdgen/testdata/routes/invalid/port-integral-float.yaml#0":   "sigs.k8s.io/yaml (kubectl) turns 8000.0 into the JSON integer 8000; CUE keeps a float, which int rejects",
}

// corpusDirs are the route files every judge must agree on.
var corpusDirs = []string{
	"testdata/routes/valid", "testdata/routes/invalid", "testdata/routes/invalid/several", "deploy/samples",
	// CRD-specific edges: bounds the generator adds, root-level rules,
	// parser differences between CUE and kubectl.
	"internal/crdgen/testdata/routes/valid", "internal/crdgen/testdata/routes/invalid",
}

// doc is one YAML document of the corpus.
type doc struct {
	id       string // file#index
	file     string
	cueErr   error
	obj      map[string]any // nil when it does not decode to an object
	parseErr error
	wants    []string // "# want: <path>: <message>" lines of the file
}

// loadCorpus reads every document, judged by CUE, and decoded for the
// Kubernetes judges the way kubectl does (sigs.k8s.io/yaml, integers kept
// as int64 so CEL sees ints).
func loadCorpus(t *testing.T) []doc {
	t.Helper()
	root := testbin.Root(t)
	v, err := schema.Default()
	if err != nil {
		t.Fatal(err)
	}
	var docs []doc
	for _, dir := range corpusDirs {
		files, err := filepath.Glob(filepath.Join(root, dir, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Fatalf("no route files in %s", dir)
		}
		sort.Strings(files)
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(root, f)
			cueDocs := v.ValidateStream(rel, src)
			kdocs := splitYAML(src)
			if len(cueDocs) != len(kdocs) {
				t.Errorf("%s: CUE sees %d documents, the YAML splitter %d", rel, len(cueDocs), len(kdocs))
				continue
			}
			wants := wantLines(src)
			for i := range cueDocs {
				d := doc{id: fmt.Sprintf("%s#%d", rel, i), file: rel, cueErr: cueDocs[i].Err, wants: wants}
				d.obj, d.parseErr = decode(kdocs[i])
				docs = append(docs, d)
			}
		}
	}
	return docs
}

// wantLines returns the messages of the file's "# want: path: message"
// comments, without the path (each judge names the field its own way).
func wantLines(src []byte) []string {
	var out []string
	for _, line := range strings.Split(string(src), "\n") {
		w, ok := strings.CutPrefix(line, "# want: ")
		if !ok {
			continue
		}
		if path, msg, ok := strings.Cut(w, ": "); ok && !strings.Contains(path, " ") {
			w = msg
		}
		out = append(out, strings.TrimSpace(w))
	}
	return out
}

// splitYAML splits a stream into its non-empty documents.
func splitYAML(src []byte) [][]byte {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(src)))
	var out [][]byte
	for {
		b, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			return append(out, []byte("\t: unreadable"))
		}
		var probe any
		if yaml.Unmarshal(b, &probe) == nil && probe == nil {
			continue // only comments or empty
		}
		out = append(out, b)
	}
}

func decode(b []byte) (map[string]any, error) {
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	var obj map[string]any
	if err := utiljson.Unmarshal(j, &obj); err != nil {
		return nil, fmt.Errorf("not an object: %w", err)
	}
	return obj, nil
}

func verdict(ok bool) string {
	if ok {
		return "accept"
	}
	return "reject"
}

type judge struct {
	name string
	fn   func(d doc) error
}

// TestThreeJudges sends every document through CUE, the in-process CRD
// validator and the real API server (server-side dry-run create with
// fieldValidation=Strict), and demands one verdict per document.
func TestThreeJudges(t *testing.T) {
	docs := loadCorpus(t)
	res, err := crdgen.Generate()
	if err != nil {
		t.Fatal(err)
	}
	inproc, err := celcheck.New(res.CRD)
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	_, cfg := testenv.Start(t)
	t.Logf("envtest started in %v", time.Since(start).Round(time.Millisecond))
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	createNamespaces(ctx, t, c, docs)

	judges := []judge{
		{"cue", func(d doc) error { return d.cueErr }},
		{"crd-inprocess", func(d doc) error {
			if d.parseErr != nil {
				return d.parseErr
			}
			if errs := inproc.Validate(ctx, deepCopy(d.obj)); len(errs) > 0 {
				return errs.ToAggregate()
			}
			return nil
		}},
		{"apiserver", func(d doc) error {
			if d.parseErr != nil {
				return d.parseErr
			}
			u := &unstructured.Unstructured{Object: deepCopy(d.obj)}
			if u.GetNamespace() == "" {
				u.SetNamespace("default")
			}
			return c.Create(ctx, u, client.DryRunAll, client.FieldValidation("Strict"))
		}},
	}

	counts := map[string][2]int{} // judge → accepted, rejected
	// How often the API server's rejection carries CUE's wording: CEL
	// rules do, OpenAPI checks (types, bounds, required) use the API
	// server's own words. Reported, not asserted.
	var worded, wordable int
	var unworded []string
	var disagree, gaps int
	judgeStart := time.Now()
	for _, d := range docs {
		errs := make([]error, len(judges))
		for i, j := range judges {
			errs[i] = j.fn(d)
			n := counts[j.name]
			if errs[i] == nil {
				n[0]++
			} else {
				n[1]++
			}
			counts[j.name] = n
		}
		cue, inproc, server := errs[0] == nil, errs[1] == nil, errs[2] == nil
		var b strings.Builder
		for i, j := range judges {
			fmt.Fprintf(&b, "\n  %-14s %s", j.name, verdict(errs[i] == nil))
			if errs[i] != nil {
				fmt.Fprintf(&b, ": %v", errs[i])
			}
		}
		reason, isGap := knownGaps[d.id]
		switch {
		case inproc != server:
			disagree++
			t.Errorf("%s: in-process CRD validation and the API server disagree:%s", d.id, b.String())
		case cue != server && isGap:
			gaps++
			t.Logf("%s: known gap (%s):%s", d.id, reason, b.String())
		case cue != server:
			disagree++
			t.Errorf("%s: judges disagree:%s", d.id, b.String())
		case isGap:
			t.Errorf("%s: listed as a known gap but all judges agree; remove it from knownGaps", d.id)
		default:
			if testing.Verbose() {
				t.Logf("%s:%s", d.id, b.String())
			}
		}
		if errs[2] != nil && len(d.wants) > 0 {
			wordable++
			if strings.Contains(errs[2].Error(), d.wants[0]) {
				worded++
			} else {
				unworded = append(unworded, d.id)
			}
		}
		// The corpus folders say what CUE must decide.
		if strings.Contains(d.file, "/invalid/") && errs[0] == nil {
			t.Errorf("%s: in an invalid/ folder but CUE accepts it", d.id)
		}
		if !strings.Contains(d.file, "/invalid/") && errs[0] != nil {
			t.Errorf("%s: in a valid folder but CUE rejects it: %v", d.id, errs[0])
		}
	}
	t.Logf("%d documents, %d disagreements, %d known gaps, judged in %v", len(docs), disagree, gaps, time.Since(judgeStart).Round(time.Millisecond))
	for _, j := range judges {
		t.Logf("  %-14s accepted %d, rejected %d", j.name, counts[j.name][0], counts[j.name][1])
	}
	t.Logf("API server rejections in CUE's words: %d of %d with a # want line", worded, wordable)
	if testing.Verbose() {
		t.Logf("in the API server's own words: %s", strings.Join(unworded, " "))
	}
}

// createNamespaces creates the well-formed namespaces the corpus names, so
// the API server judges the route, not a missing namespace.
func createNamespaces(ctx context.Context, t *testing.T, c client.Client, docs []doc) {
	t.Helper()
	seen := map[string]bool{"default": true}
	for _, d := range docs {
		if d.obj == nil {
			continue
		}
		ns := (&unstructured.Unstructured{Object: d.obj}).GetNamespace()
		if ns == "" || seen[ns] || len(apivalidation.ValidateNamespaceName(ns, false)) > 0 {
			continue
		}
		seen[ns] = true
		err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create namespace %s: %v", ns, err)
		}
	}
}

func deepCopy(obj map[string]any) map[string]any {
	return runtimeDeepCopy(obj).(map[string]any)
}

func runtimeDeepCopy(x any) any {
	switch t := x.(type) {
	case map[string]any:
		m := make(map[string]any, len(t))
		for k, v := range t {
			m[k] = runtimeDeepCopy(v)
		}
		return m
	case []any:
		s := make([]any, len(t))
		for i, v := range t {
			s[i] = runtimeDeepCopy(v)
		}
		return s
	default:
		return t
	}
}
