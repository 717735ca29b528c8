package charttest

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	_ "github.com/modelsphere/autoconfig/internal/controller" // registers the controller's metrics
	"github.com/modelsphere/autoconfig/internal/hagate"
	"github.com/modelsphere/autoconfig/internal/reload"
)

var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

// metricNames are the names the binaries expose: the controller's
// registry (its own metrics and controller-runtime's) and the sidecars'
// metric sets as their binaries register them, every series described
// whether or not it has a value yet.
func metricNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	describe := func(c prometheus.Collector) {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if m := descName.FindStringSubmatch(d.String()); m != nil {
				names[m[1]] = true
			}
		}
	}
	ctrlReg, ok := crmetrics.Registry.(prometheus.Collector)
	if !ok {
		t.Fatalf("controller-runtime's registry %T cannot be described", crmetrics.Registry)
	}
	describe(ctrlReg)
	for _, register := range []func(prometheus.Registerer){
		func(r prometheus.Registerer) { reload.NewMetrics(r) },
		func(r prometheus.Registerer) { hagate.NewMetrics(r) },
	} {
		reg := prometheus.NewRegistry()
		register(reg)
		describe(reg)
	}
	for _, n := range engineFamilies(t) {
		names[n] = true
	}
	return names
}

// engineFamily is a family declared in router_metrics.lua's M.families
// (`name = "autoconfig_engine_…"`).
var engineFamily = regexp.MustCompile(`(?m)^\s*\{\s*name\s*=\s*"(autoconfig_engine_[a-z0-9_]+)"`)

// engineFamilies are the metric families the lua routing engine serves
// (deploy/openresty/lua/router_metrics.lua, M.families): nginx serves
// them, no Go binary, so they are read from the module's source.
func engineFamilies(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(root, "deploy", "openresty", "lua", "router_metrics.lua"))
	must(t, err)
	var out []string
	for _, m := range engineFamily.FindAllStringSubmatch(string(src), -1) {
		out = append(out, m[1])
	}
	if len(out) < 10 {
		t.Fatalf("router_metrics.lua declares only %v (want every M.families entry as `{ name = \"autoconfig_engine_…\"`)", out)
	}
	return out
}

// TestAlertsAndDashboardUseRealMetrics: the chart's PrometheusRule and
// Grafana dashboard parse with Prometheus' own rule and PromQL parsers
// (hack/promcheck), and every metric they read is one the binaries
// register (a renamed metric would leave an alert that never fires).
func TestAlertsAndDashboardUseRealMetrics(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to run hack/promcheck: %v", err)
	}
	rel := render(t, "obs", "obs", map[string]any{"metrics": map[string]any{
		"prometheusRule":   map[string]any{"enabled": true},
		"grafanaDashboard": map[string]any{"enabled": true},
	}})
	pr := rel.Find("PrometheusRule", "obs", "obs-autoconfig")
	dash := rel.Find("ConfigMap", "obs", "obs-autoconfig-dashboard")
	if pr == nil || dash == nil {
		t.Fatalf("the chart renders no PrometheusRule or dashboard: %v", rel.Kinds())
	}
	if off := render(t, "obs", "obs", nil); off.Find("PrometheusRule", "obs", "obs-autoconfig") != nil || off.Find("ConfigMap", "obs", "obs-autoconfig-dashboard") != nil {
		t.Fatal("the PrometheusRule or dashboard is rendered by default (it needs the Prometheus Operator / Grafana)")
	}
	dir := t.TempDir()
	groups, err := yaml.Marshal(pr.Object["spec"])
	must(t, err)
	rules := filepath.Join(dir, "rules.yaml")
	must(t, os.WriteFile(rules, groups, 0o644))

	data, _ := dash.Object["data"].(map[string]any)
	raw, _ := data["autoconfig.json"].(string)
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(raw), &d); err != nil || len(d.Panels) == 0 {
		t.Fatalf("dashboard JSON: %v (%d panels)", err, len(d.Panels))
	}
	var exprs []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	exprFile := filepath.Join(dir, "exprs.txt")
	must(t, os.WriteFile(exprFile, []byte(strings.Join(exprs, "\n")+"\n"), 0o644))

	cmd := exec.Command(goBin, "-C", filepath.Join(root, "hack", "promcheck"), "run", ".", "-rules", rules, "-exprs", exprFile)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("promcheck: %v\n%s", err, stderr.String())
	}
	known := metricNames(t)
	read := strings.Fields(stdout.String())
	if len(read) < 10 {
		t.Fatalf("the rules and dashboard read only %v", read)
	}
	for _, n := range read {
		base := n
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(n, suffix); ok && known[b] {
				base = b
			}
		}
		if !known[base] {
			t.Errorf("the rules or the dashboard read %s, which no binary registers", n)
		}
	}
	if !slices.Contains(read, "autoconfig_route_backends") || !slices.Contains(read, "autoconfig_reload_reloads_total") {
		t.Errorf("read %v", read)
	}
}
