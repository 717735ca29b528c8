package schema_test

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelsphere/autoconfig/schema/routespec"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TestCanaryDefaults: the route the compiler receives has every split key
// filled once it has a canary (the routespec defaults, which the engine and
// the CRD's rules also assume), keeps the keys it gives, and has neither a
// canary nor a split without spec.canary (rendered as before the fields
// existed).
func TestCanaryDefaults(t *testing.T) {
	v := mustValidator(t)
	const head = `apiVersion: routing.modelsphere.dev/v1alpha1
kind: ModelRoute
metadata: {name: qwen, namespace: llm}
spec:
  discovery: {service: qwen}
  nginx: {outputConfigMap: routes, peers: [{use: backend}]}
`
	defaults := routespec.Split{StickyHeader: routespec.DefaultStickyHeader, OverrideHeader: routespec.DefaultOverrideHeader, StickyCookie: routespec.DefaultStickyCookie}
	for _, c := range []struct {
		name, extra string
		want        *routespec.Split
		weight      int32
	}{
		{"no canary", "", nil, 0},
		{"canary, no split", "  canary: {discovery: {service: qwen-v2}, weight: 0}\n", &defaults, 0},
		{"canary, empty split", "  canary: {discovery: {selector: app=qwen-v2}, weight: 100}\n  split: {}\n", &defaults, 100},
		{"canary, one key", "  canary: {discovery: {service: qwen-v2}, weight: 7}\n  split: {overrideHeader: x-version}\n",
			&routespec.Split{StickyHeader: routespec.DefaultStickyHeader, OverrideHeader: "x-version", StickyCookie: routespec.DefaultStickyCookie}, 7},
		{"canary, every key", "  canary: {discovery: {service: qwen-v2}, weight: 7}\n  split: {stickyHeader: a, overrideHeader: b, stickyCookie: C}\n",
			&routespec.Split{StickyHeader: "a", OverrideHeader: "b", StickyCookie: "C"}, 7},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := v.Validate("route.yaml", []byte(head+c.extra))
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.want == nil:
				if r.Spec.Canary != nil || r.Spec.Split != nil {
					t.Errorf("a route without spec.canary got canary %+v, split %+v", r.Spec.Canary, r.Spec.Split)
				}
			case r.Spec.Split == nil || *r.Spec.Split != *c.want:
				t.Errorf("split %+v, want %+v", r.Spec.Split, *c.want)
			case r.Spec.Canary == nil || r.Spec.Canary.Weight != c.weight || r.Spec.Canary.Discovery.IncludeNotReady:
				t.Errorf("canary %+v, want weight %d and includeNotReady false", r.Spec.Canary, c.weight)
			}
		})
	}
}

// TestCanaryDefaultsFromObject: a route read from the API server (the
// controller's path) gets the same defaults; weight 0 is a weight, not an
// absent one.
func TestCanaryDefaultsFromObject(t *testing.T) {
	v := mustValidator(t)
	in := &v1alpha1.ModelRoute{ObjectMeta: metav1.ObjectMeta{Name: "qwen", Namespace: "llm"}}
	in.Spec.Discovery.Service = "qwen"
	in.Spec.Nginx.OutputConfigMap = "routes"
	in.Spec.Nginx.Peers = []v1alpha1.Peer{{Use: v1alpha1.UseBackend, Priority: 2}}
	in.Spec.Canary = &v1alpha1.Canary{Discovery: v1alpha1.Discovery{Service: "qwen-v2"}}
	r, err := v.ValidateObject(in)
	if err != nil {
		t.Fatal(err)
	}
	want := routespec.Split{StickyHeader: routespec.DefaultStickyHeader, OverrideHeader: routespec.DefaultOverrideHeader, StickyCookie: routespec.DefaultStickyCookie}
	if r.Spec.Split == nil || *r.Spec.Split != want || r.Spec.Canary.Weight != 0 {
		t.Errorf("canary %+v split %+v; want weight 0 and split %+v", r.Spec.Canary, r.Spec.Split, want)
	}
	// The same Service, as text: refused here as by the API server.
	in.Spec.Canary.Discovery.Service = "qwen"
	if _, err := v.ValidateObject(in); err == nil || !strings.Contains(err.Error(), "spec.canary.discovery.service: canary.discovery.service is the Service of spec.discovery") {
		t.Errorf("same Service: got %v", err)
	}
}
