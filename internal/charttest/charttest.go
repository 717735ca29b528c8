// Package charttest renders the Helm chart deploy/helm/autoconfig with
// Helm's own Go SDK (the same engine `helm install` uses), so tests can
// check the rendered objects and apply them to a real API server.
package charttest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// ChartDir is the chart, relative to the module root.
const ChartDir = "deploy/helm/autoconfig"

// KubeVersion is the Kubernetes version rendered against (the envtest
// control plane's).
const KubeVersion = "v1.37.2"

// Release is a rendered release.
type Release struct {
	Chart *chart.Chart
	// CRDs are the chart's crds/ objects (installed before the templates,
	// never templated).
	CRDs []*unstructured.Unstructured
	// Objects are the rendered templates' objects, in file order.
	Objects []*unstructured.Unstructured
}

// Render renders the chart at dir for a release name in namespace with
// values (merged over values.yaml, as `helm install -f` would).
func Render(dir, name, namespace string, values map[string]any) (*Release, error) {
	chrt, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	kv, err := chartutil.ParseKubeVersion(KubeVersion)
	if err != nil {
		return nil, err
	}
	caps.KubeVersion = *kv
	if chrt.Metadata.KubeVersion != "" && !chartutil.IsCompatibleRange(chrt.Metadata.KubeVersion, KubeVersion) {
		return nil, fmt.Errorf("chart requires kubeVersion %s, not %s", chrt.Metadata.KubeVersion, KubeVersion)
	}
	if err := chartutil.ProcessDependenciesWithMerge(chrt, values); err != nil {
		return nil, err
	}
	vals, err := chartutil.ToRenderValues(chrt, values, chartutil.ReleaseOptions{Name: name, Namespace: namespace, IsInstall: true, Revision: 1}, caps)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	files, err := engine.Render(chrt, vals)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	rel := &Release{Chart: chrt}
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		if !strings.HasSuffix(f, ".yaml") {
			continue // NOTES.txt, _helpers.tpl
		}
		objs, err := decode(files[f])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		rel.Objects = append(rel.Objects, objs...)
	}
	for _, crd := range chrt.CRDObjects() {
		objs, err := decode(string(crd.File.Data))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", crd.Filename, err)
		}
		rel.CRDs = append(rel.CRDs, objs...)
	}
	return rel, nil
}

// decode splits a multi-document YAML stream into objects, dropping empty
// documents (a template whose condition is false).
func decode(s string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(s)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, err
		}
		if t := bytes.TrimSpace(j); len(t) == 0 || string(t) == "null" || string(t) == "{}" {
			continue
		}
		// UnmarshalJSON keeps integers as int64 (plain JSON would give
		// float64).
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(j); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
}

// Find returns the rendered object of kind, namespace and name, or nil.
func (r *Release) Find(kind, namespace, name string) *unstructured.Unstructured {
	for _, o := range r.Objects {
		if o.GetKind() == kind && o.GetNamespace() == namespace && o.GetName() == name {
			return o
		}
	}
	return nil
}

// Kinds lists "Kind namespace/name" of every object, for messages.
func (r *Release) Kinds() []string {
	var out []string
	for _, o := range r.Objects {
		out = append(out, fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName()))
	}
	return out
}

// Path joins the module root and the chart directory.
func Path(root string) string { return filepath.Join(root, ChartDir) }

// metricRef matches the metric names the chart's rules and dashboard read.
var metricRef = regexp.MustCompile(`\b(?:autoconfig|controller_runtime|workqueue|rest_client)_[a-z_]+\b`)

// MetricsRead renders the chart (root is the module root) with its
// PrometheusRule and Grafana dashboard enabled and returns the metric
// names they read, without the _bucket, _sum and _count suffixes of a
// histogram's series, sorted. Tests that run the real binaries check
// each name against a scrape of the binary that serves it (MetricOwner).
func MetricsRead(root string) ([]string, error) {
	rel, err := Render(Path(root), "obs", "obs", map[string]any{"metrics": map[string]any{
		"prometheusRule":   map[string]any{"enabled": true},
		"grafanaDashboard": map[string]any{"enabled": true},
	}})
	if err != nil {
		return nil, err
	}
	pr := rel.Find("PrometheusRule", "obs", "obs-autoconfig")
	dash := rel.Find("ConfigMap", "obs", "obs-autoconfig-dashboard")
	if pr == nil || dash == nil {
		return nil, errors.New("the chart renders no PrometheusRule or dashboard ConfigMap")
	}
	rules, err := yaml.Marshal(pr.Object["spec"])
	if err != nil {
		return nil, err
	}
	data, _ := dash.Object["data"].(map[string]any)
	board, _ := data["autoconfig.json"].(string)
	seen := map[string]bool{}
	for _, n := range metricRef.FindAllString(string(rules)+"\n"+board, -1) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(n, suffix); ok && (strings.HasSuffix(b, "_seconds") || strings.HasSuffix(b, "_bytes")) {
				n = b
			}
		}
		seen[n] = true
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// MetricOwner is the binary that serves a metric: "reload", "hagate" or
// "readyz" by prefix, "engine" for the lua routing engine's
// (autoconfig_engine_*, served by nginx), else the controller
// ("autoconfig").
func MetricOwner(name string) string {
	for _, b := range []string{"reload", "hagate", "readyz", "engine"} {
		if strings.HasPrefix(name, "autoconfig_"+b+"_") {
			return b
		}
	}
	return "autoconfig"
}

// ScrapeLacks checks a Prometheus text exposition body scraped from
// binary against the names the chart reads (MetricsRead): it returns how
// many of them binary serves (MetricOwner) and those the body lacks (no
// "# TYPE name" line), plus autoconfig_build_info{binary=...} when that
// series is missing.
func ScrapeLacks(read []string, binary, body string) (owned int, missing []string) {
	for _, n := range read {
		if MetricOwner(n) != binary {
			continue
		}
		owned++
		if !strings.Contains("\n"+body, "\n# TYPE "+n+" ") {
			missing = append(missing, n)
		}
	}
	if info := `autoconfig_build_info{binary="` + binary + `"`; !strings.Contains(body, info) {
		missing = append(missing, info+"}")
	}
	return owned, missing
}
