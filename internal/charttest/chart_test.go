package charttest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/internal/testenv"
)

var (
	root    string
	testEnv *envtest.Environment
	testCfg *rest.Config
	k8s     client.Client
)

// must is testbin.Must under the short name the chart tests use throughout.
var must = testbin.Must

// TestMain starts one control plane for the package (CRDs installed once).
func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	var err error
	if root, err = testbin.ModuleRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env, cfg, stop, err := testenv.StartForMain()
	if err != nil {
		fmt.Fprintln(os.Stderr, "charttest:", err)
		return 1
	}
	defer stop()
	testEnv, testCfg = env, cfg
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme.Scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func render(t *testing.T, name, ns string, values map[string]any) *Release {
	t.Helper()
	rel, err := Render(Path(root), name, ns, values)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return rel
}

// sampleSpec reads a deploy/samples route's spec, as a user would paste it
// under modelRoutes:.
func sampleSpec(t *testing.T, file string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy", "samples", file))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m["spec"].(map[string]any)
}

// The chart's version and appVersion follow cmd/autoconfig's Version.
func TestChartVersionFollowsBinary(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "internal", "cli", "cli.go"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^var Version = "([^"]+)"`).FindSubmatch(b)
	if m == nil {
		t.Fatal(`internal/cli/cli.go has no line var Version = "…"`)
	}
	rel := render(t, "ac", "autoconfig-system", nil)
	if v := string(m[1]); rel.Chart.Metadata.Version != v || rel.Chart.Metadata.AppVersion != v {
		t.Errorf("Chart.yaml version %s appVersion %s, internal/cli Version %s: bump them together",
			rel.Chart.Metadata.Version, rel.Chart.Metadata.AppVersion, v)
	}
}

// The chart ships the generated CRD unchanged (make generate copies it).
func TestChartCRDIsTheGeneratedOne(t *testing.T) {
	const name = "routing.modelsphere.dev_modelroutes.yaml"
	want, err := os.ReadFile(filepath.Join(root, "deploy", "crds", name))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(Path(root), "crds", name))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("deploy/helm/autoconfig/crds/%s differs from deploy/crds/%s: run make generate", name, name)
	}
	rel := render(t, "ac", "autoconfig-system", nil)
	if len(rel.CRDs) != 1 || rel.CRDs[0].GetName() != "modelroutes.routing.modelsphere.dev" {
		t.Errorf("chart CRDs = %v, want the modelroutes CRD", rel.CRDs)
	}
}

type rule struct {
	groups, resources, verbs []string
}

func rules(t *testing.T, o *unstructured.Unstructured) []rule {
	t.Helper()
	raw, _, _ := unstructured.NestedSlice(o.Object, "rules")
	var out []rule
	for _, r := range raw {
		m := r.(map[string]any)
		out = append(out, rule{strs(m["apiGroups"]), strs(m["resources"]), strs(m["verbs"])})
	}
	return out
}

func strs(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// verbs collects the verbs granted on group/resource.
func verbs(rs []rule, group, resource string) []string {
	var out []string
	for _, r := range rs {
		if slices.Contains(r.groups, group) && slices.Contains(r.resources, resource) {
			out = append(out, r.verbs...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func TestDefaultRender(t *testing.T) {
	const ns = "autoconfig-system"
	rel := render(t, "ac", ns, nil)
	for _, want := range []string{
		"ServiceAccount " + ns + "/ac-autoconfig",
		"ClusterRole /ac-autoconfig", "ClusterRoleBinding /ac-autoconfig",
		"ClusterRole /ac-autoconfig-nodes", "ClusterRoleBinding /ac-autoconfig-nodes",
		"ClusterRole /ac-autoconfig-diff",
		"Role " + ns + "/ac-autoconfig-leader-election", "RoleBinding " + ns + "/ac-autoconfig-leader-election",
		"Deployment " + ns + "/ac-autoconfig", "Service " + ns + "/ac-autoconfig-metrics",
		"ValidatingAdmissionPolicy /ac-autoconfig-served-report", "ValidatingAdmissionPolicyBinding /ac-autoconfig-served-report",
	} {
		if !slices.Contains(rel.Kinds(), want) {
			t.Errorf("default render lacks %s; got %v", want, rel.Kinds())
		}
	}
	if off := render(t, "ac", ns, map[string]any{"servedReport": map[string]any{"admissionPolicy": false}}); off.Find("ValidatingAdmissionPolicy", "", "ac-autoconfig-served-report") != nil {
		t.Errorf("servedReport.admissionPolicy=false still renders the policy")
	}
	for _, o := range rel.Objects {
		if o.GetKind() == "ServiceMonitor" || o.GetKind() == "ModelRoute" {
			t.Errorf("default render has %s %s (off by default)", o.GetKind(), o.GetName())
		}
	}

	cr := rules(t, rel.Find("ClusterRole", "", "ac-autoconfig"))
	for _, r := range cr {
		if slices.Contains(r.verbs, "*") || slices.Contains(r.resources, "*") || slices.Contains(r.groups, "*") {
			t.Errorf("wildcard rule %+v", r)
		}
	}
	for _, c := range []struct {
		group, resource string
		want            []string
	}{
		{"", "configmaps", []string{"get", "list", "patch", "watch"}},
		{"discovery.k8s.io", "endpointslices", []string{"get", "list", "watch"}},
		{"", "pods", []string{"get", "list", "watch"}},
		// Service writes (fallback Services) only by a Role per listed namespace.
		{"", "services", []string{"get", "list", "watch"}},
		{"routing.modelsphere.dev", "modelroutes", []string{"get", "list", "patch", "watch"}},
		{"routing.modelsphere.dev", "modelroutes/status", []string{"get", "patch"}},
		{"routing.modelsphere.dev", "modelroutes/finalizers", []string{"update"}},
		{"", "nodes", nil},
		{"coordination.k8s.io", "leases", nil},
	} {
		if got := verbs(cr, c.group, c.resource); !slices.Equal(got, c.want) {
			t.Errorf("ClusterRole verbs on %s %q = %v, want %v", c.resource, c.group, got, c.want)
		}
	}
	for _, o := range rel.Objects {
		if strings.HasSuffix(o.GetName(), "-fallback-services") {
			t.Errorf("default render grants fallback Service writes: %s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
		}
	}
	if got := verbs(rules(t, rel.Find("ClusterRole", "", "ac-autoconfig-nodes")), "", "nodes"); !slices.Equal(got, []string{"get", "list", "watch"}) {
		t.Errorf("nodes verbs = %v", got)
	}
	if got := verbs(rules(t, rel.Find("Role", ns, "ac-autoconfig-leader-election")), "coordination.k8s.io", "leases"); !slices.Equal(got, []string{"create", "get", "update"}) {
		t.Errorf("lease verbs = %v", got)
	}

	dep := rel.Find("Deployment", ns, "ac-autoconfig")
	c := container(t, dep)
	if c["image"] != "ghcr.io/modelsphere/autoconfig:"+rel.Chart.Metadata.AppVersion {
		t.Errorf("image = %v, want the appVersion tag", c["image"])
	}
	args := strs(c["args"])
	for _, want := range []string{"controller", "--leader-elect=true", "--leader-election-namespace=" + ns, "--kube-api-qps=500", "--kube-api-burst=1000", "--leader-elect-lease-duration=15s", "--leader-elect-renew-deadline=10s", "--leader-elect-retry-period=2s"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %v lack %s", args, want)
		}
	}
	if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--watch-namespaces") }) {
		t.Errorf("cluster-wide install passes --watch-namespaces: %v", args)
	}
	if p, _, _ := unstructured.NestedString(c, "livenessProbe", "httpGet", "path"); p != "/healthz" {
		t.Errorf("liveness path %q", p)
	}
	if p, _, _ := unstructured.NestedString(c, "readinessProbe", "httpGet", "path"); p != "/readyz" {
		t.Errorf("readiness path %q", p)
	}
	sc, _, _ := unstructured.NestedMap(c, "securityContext")
	if sc["readOnlyRootFilesystem"] != true || sc["runAsNonRoot"] != true || sc["allowPrivilegeEscalation"] != false {
		t.Errorf("container securityContext %v", sc)
	}
	if drop, _, _ := unstructured.NestedStringSlice(c, "securityContext", "capabilities", "drop"); !slices.Equal(drop, []string{"ALL"}) {
		t.Errorf("capabilities.drop = %v", drop)
	}
	// Two leader-elected replicas by default, kept through node drains by
	// a PodDisruptionBudget that selects exactly the controller's pods.
	if r, _, _ := unstructured.NestedInt64(dep.Object, "spec", "replicas"); r != 2 {
		t.Errorf("replicas = %d, want 2", r)
	}
	pdb := rel.Find("PodDisruptionBudget", dep.GetNamespace(), dep.GetName())
	if pdb == nil {
		t.Fatalf("no PodDisruptionBudget; got %v", rel.Kinds())
	}
	sel, _, _ := unstructured.NestedStringMap(pdb.Object, "spec", "selector", "matchLabels")
	podLabels, _, _ := unstructured.NestedStringMap(dep.Object, "spec", "template", "metadata", "labels")
	for k, v := range sel {
		if podLabels[k] != v {
			t.Errorf("the PDB selects %s=%s, which the controller's pods do not carry (%v)", k, v, podLabels)
		}
	}
	if m, _, _ := unstructured.NestedInt64(pdb.Object, "spec", "minAvailable"); m != 1 || len(sel) == 0 {
		t.Errorf("PDB minAvailable %d, selector %v", m, sel)
	}
	if one := render(t, "ac", "autoconfig-system", map[string]any{"replicaCount": 1}); one.Find("PodDisruptionBudget", "autoconfig-system", "ac-autoconfig") != nil {
		t.Error("a single replica gets a PodDisruptionBudget (it would block every node drain)")
	}
}

// TestValuesSchemaRejectsMistakes: values.schema.json refuses wrong types
// and misspelled keys at install time, naming the value, instead of a
// silent render or a template error.
func TestValuesSchemaRejectsMistakes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"replicaCount=two", map[string]any{"replicaCount": "two"}, "replicaCount"},
		{"misspelled serviceMonitor.enable", map[string]any{"metrics": map[string]any{"serviceMonitor": map[string]any{"enable": true}}}, "enable"},
		{"watchNamespaces=llm (not a list)", map[string]any{"watchNamespaces": "llm"}, "watchNamespaces"},
		{"logLevel=verbose", map[string]any{"logLevel": "verbose"}, "logLevel"},
		{"unknown top-level key", map[string]any{"replicas": 3}, "replicas"},
		{"route without spec", map[string]any{"modelRoutes": []any{map[string]any{"name": "qwen"}}}, "spec"},
		{"leaseDuration=15 (not a duration)", map[string]any{"leaderElection": map[string]any{"leaseDuration": 15}}, "leaseDuration"},
		{"renewDeadline=10 seconds", map[string]any{"leaderElection": map[string]any{"renewDeadline": "10 seconds"}}, "renewDeadline"},
		{"kubeAPI.qps=0", map[string]any{"kubeAPI": map[string]any{"qps": 0}}, "qps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(Path(root), "ac", "autoconfig-system", tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render: %v; want an error naming %q", err, tc.want)
			}
			t.Log(err)
		})
	}
	if _, err := Render(Path(root), "ac", "autoconfig-system", map[string]any{"watchNamespaces": []any{"llm", "llm-route"}, "replicaCount": 3}); err != nil {
		t.Errorf("valid values refused: %v", err)
	}
	// The Lease timings and the rate limit reach the controller's flags; a
	// negative qps (no client-side limit) is allowed.
	rel, err := Render(Path(root), "ac", "autoconfig-system", map[string]any{
		"leaderElection": map[string]any{"leaseDuration": "30s", "renewDeadline": "20s", "retryPeriod": "2500ms"},
		"kubeAPI":        map[string]any{"qps": -1},
	})
	if err != nil {
		t.Fatalf("valid values refused: %v", err)
	}
	args := strs(container(t, rel.Find("Deployment", "autoconfig-system", "ac-autoconfig"))["args"])
	for _, want := range []string{"--leader-elect-lease-duration=30s", "--leader-elect-renew-deadline=20s", "--leader-elect-retry-period=2500ms", "--kube-api-qps=-1"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %v lack %s", args, want)
		}
	}
}

func container(t *testing.T, dep *unstructured.Unstructured) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("containers = %d, want 1", len(cs))
	}
	return cs[0].(map[string]any)
}

func TestScopedRender(t *testing.T) {
	const ns = "autoconfig-system"
	rel := render(t, "ac", ns, map[string]any{
		"watchNamespaces":   []any{"llm-route", "llm"},
		"trustedNamespaces": []any{"llm-route"},
		"failOpen":          map[string]any{"fallbackServiceNamespaces": []any{"llm-route"}},
		"replicaCount":      3,
		"image":             map[string]any{"tag": "dev"},
		"metrics":           map[string]any{"serviceMonitor": map[string]any{"enabled": true}},
		"modelRoutes":       []any{map[string]any{"name": "wan-video", "namespace": "llm-route", "spec": sampleSpec(t, "modelroute-video.yaml")}},
		"leaderElection":    map[string]any{"enabled": true},
		"logLevel":          "debug",
		"serviceAccount":    map[string]any{"name": "custom-sa"},
		"podLabels":         map[string]any{"team": "inference"},
		"priorityClassName": "system-cluster-critical",
	})
	if rel.Find("ClusterRole", "", "ac-autoconfig") != nil || rel.Find("ClusterRoleBinding", "", "ac-autoconfig") != nil {
		t.Errorf("scoped install still renders the cluster-wide role: %v", rel.Kinds())
	}
	for _, wns := range []string{"llm-route", "llm"} {
		role := rel.Find("Role", wns, "ac-autoconfig")
		if role == nil || rel.Find("RoleBinding", wns, "ac-autoconfig") == nil {
			t.Fatalf("no Role+RoleBinding in %s: %v", wns, rel.Kinds())
		}
		rs := rules(t, role)
		if got := verbs(rs, "", "services"); !slices.Equal(got, []string{"get", "list", "watch"}) {
			t.Errorf("services verbs %v in the watch Role, want read-only", got)
		}
		if got := verbs(rs, "", "configmaps"); slices.Contains(got, "create") {
			t.Errorf("configmaps verbs %v include create", got)
		}
		sub, _, _ := unstructured.NestedSlice(rel.Find("RoleBinding", wns, "ac-autoconfig").Object, "subjects")
		if s := sub[0].(map[string]any); s["name"] != "custom-sa" || s["namespace"] != ns {
			t.Errorf("RoleBinding subject %v", s)
		}
	}
	if rel.Find("ClusterRole", "", "ac-autoconfig-nodes") == nil {
		t.Error("scoped install lacks the nodes ClusterRole")
	}
	fb := rel.Find("Role", "llm-route", "ac-autoconfig-fallback-services")
	if fb == nil || rel.Find("RoleBinding", "llm-route", "ac-autoconfig-fallback-services") == nil {
		t.Fatalf("no fallback-services Role+RoleBinding in llm-route: %v", rel.Kinds())
	}
	if got := verbs(rules(t, fb), "", "services"); !slices.Equal(got, []string{"create", "delete", "patch"}) {
		t.Errorf("fallback services verbs %v", got)
	}
	if rel.Find("Role", "llm", "ac-autoconfig-fallback-services") != nil {
		t.Error("fallback Service writes granted in a namespace not listed")
	}
	dep := rel.Find("Deployment", ns, "ac-autoconfig")
	c := container(t, dep)
	if c["image"] != "ghcr.io/modelsphere/autoconfig:dev" {
		t.Errorf("image %v", c["image"])
	}
	args := strs(c["args"])
	for _, want := range []string{"--watch-namespaces=llm-route,llm", "--trusted-namespace=llm-route", "--log-level=debug", "--leader-elect=true"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %v lack %s", args, want)
		}
	}
	if r, _, _ := unstructured.NestedInt64(dep.Object, "spec", "replicas"); r != 3 {
		t.Errorf("replicas = %d", r)
	}
	if sa, _, _ := unstructured.NestedString(dep.Object, "spec", "template", "spec", "serviceAccountName"); sa != "custom-sa" {
		t.Errorf("serviceAccountName %q", sa)
	}
	if rel.Find("ServiceMonitor", ns, "ac-autoconfig") == nil {
		t.Errorf("no ServiceMonitor: %v", rel.Kinds())
	}
	mr := rel.Find("ModelRoute", "llm-route", "wan-video")
	if mr == nil {
		t.Fatalf("no ModelRoute llm-route/wan-video: %v", rel.Kinds())
	}
	if got, _, _ := unstructured.NestedString(mr.Object, "spec", "nginx", "values", "rate_limit"); got != "200Mbps" {
		t.Errorf("ModelRoute spec not rendered verbatim: rate_limit %q", got)
	}
}

// TestApplyToAPIServer creates every rendered object on a real API server
// (the CRD's schema and CEL rules judge the ModelRoutes), then checks what
// the chart's ServiceAccount may do with SubjectAccessReviews and with real
// requests impersonating it.
func TestApplyToAPIServer(t *testing.T) {
	cases := []struct {
		name, ns string
		values   map[string]any
		routeNS  string
		// outside is a namespace the ServiceAccount must not write.
		outside string
	}{
		{name: "wide", ns: "ac-wide", routeNS: "routes-wide", values: map[string]any{
			"modelRoutes": []any{
				map[string]any{"name": "qwen", "namespace": "routes-wide", "spec": sampleSpec(t, "modelroute-llm.yaml")},
				map[string]any{"name": "wan-video", "namespace": "routes-wide", "spec": sampleSpec(t, "modelroute-video.yaml")},
			},
		}},
		{name: "scoped", ns: "ac-scoped", routeNS: "routes-scoped", outside: "elsewhere", values: map[string]any{
			"watchNamespaces": []any{"routes-scoped"},
			"replicaCount":    2,
			"modelRoutes": []any{
				map[string]any{"name": "wan-video", "namespace": "routes-scoped", "spec": sampleSpec(t, "modelroute-video.yaml")},
			},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			rel := render(t, tc.name, tc.ns, tc.values)
			for _, n := range []string{tc.ns, tc.routeNS, tc.outside} {
				if n == "" {
					continue
				}
				if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
					t.Fatalf("namespace %s: %v", n, err)
				}
			}
			for _, o := range rel.Objects {
				if err := k8s.Create(ctx, o.DeepCopy()); err != nil {
					t.Fatalf("create %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
				}
			}
			sa := "system:serviceaccount:" + tc.ns + ":" + tc.name + "-autoconfig"
			can := func(ns, group, resource, verb string) bool {
				t.Helper()
				sar := &authv1.SubjectAccessReview{Spec: authv1.SubjectAccessReviewSpec{
					User:               sa,
					Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + tc.ns, "system:authenticated"},
					ResourceAttributes: &authv1.ResourceAttributes{Namespace: ns, Group: group, Resource: resource, Verb: verb},
				}}
				if err := k8s.Create(ctx, sar); err != nil {
					t.Fatalf("SubjectAccessReview: %v", err)
				}
				return sar.Status.Allowed
			}
			for _, c := range []struct {
				ns, group, resource, verb string
				want                      bool
			}{
				{tc.routeNS, "", "configmaps", "create", false},
				{tc.routeNS, "", "configmaps", "delete", false},
				{tc.routeNS, "", "configmaps", "patch", true},
				{tc.routeNS, "", "configmaps", "watch", true},
				{tc.routeNS, "", "secrets", "get", false},
				{tc.routeNS, "discovery.k8s.io", "endpointslices", "list", true},
				{tc.routeNS, "discovery.k8s.io", "endpointslices", "update", false},
				{tc.routeNS, "routing.modelsphere.dev", "modelroutes", "create", false},
				{tc.routeNS, "routing.modelsphere.dev", "modelroutes/status", "patch", true},
				{tc.routeNS, "", "services", "create", false},
				{tc.routeNS, "", "configmaps", "update", false},
				{tc.routeNS, "routing.modelsphere.dev", "modelroutes", "update", false},
				{tc.routeNS, "routing.modelsphere.dev", "modelroutes/status", "update", false},
				{"", "", "nodes", "list", true},
				{tc.ns, "coordination.k8s.io", "leases", "create", true},
				{tc.ns, "coordination.k8s.io", "leases", "delete", false},
			} {
				if got := can(c.ns, c.group, c.resource, c.verb); got != c.want {
					t.Errorf("%s may %s %s.%s in %q: %v, want %v", sa, c.verb, c.resource, c.group, c.ns, got, c.want)
				}
			}
			if tc.outside != "" && can(tc.outside, "", "configmaps", "patch") {
				t.Errorf("scoped install may patch ConfigMaps in %s (not watched)", tc.outside)
			}

			// Real requests as the ServiceAccount: an existing ConfigMap can
			// be patched, not replaced whole, and a new one cannot be created.
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: tc.routeNS, Name: "openresty-conf"}}
			if err := k8s.Create(ctx, cm); err != nil {
				t.Fatal(err)
			}
			as := impersonate(t, tc.ns, tc.name+"-autoconfig")
			got := &corev1.ConfigMap{}
			if err := as.Get(ctx, client.ObjectKeyFromObject(cm), got); err != nil {
				t.Fatalf("get as the ServiceAccount: %v", err)
			}
			orig := got.DeepCopy()
			got.Data = map[string]string{"session_route_x.conf": "# x\n"}
			if err := as.Patch(ctx, got, client.MergeFrom(orig)); err != nil {
				t.Errorf("patch an existing ConfigMap as the ServiceAccount: %v", err)
			}
			if err := as.Update(ctx, got); !apierrors.IsForbidden(err) {
				t.Errorf("update a ConfigMap as the ServiceAccount: %v, want Forbidden", err)
			}
			err := as.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: tc.routeNS, Name: "new"}})
			if !apierrors.IsForbidden(err) {
				t.Errorf("create a ConfigMap as the ServiceAccount: %v, want Forbidden", err)
			}
		})
	}
}

func impersonate(t *testing.T, ns, name string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(testCfg)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
