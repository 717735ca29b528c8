package charttest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TestCRDUpgradeFrom010: the documented upgrade path (server-side apply
// of the new CRD before helm upgrade) works from release 0.1.0's CRD:
// the apply has no conflicts, a route stored under the old CRD (with the
// status field 0.1.0 wrote) stays readable and valid, and its status can
// be written under the new schema. The test leaves the current CRD
// installed.
func TestCRDUpgradeFrom010(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	apply := func(file string, opts ...client.PatchOption) {
		t.Helper()
		b, err := os.ReadFile(file)
		must(t, err)
		var u unstructured.Unstructured
		must(t, yaml.Unmarshal(b, &u.Object))
		u.SetManagedFields(nil)
		// The field manager kubectl apply --server-side uses; no force:
		// an upgrade that conflicts with the previous apply fails here.
		//nolint:staticcheck // client.Apply with unstructured objects
		if err := k8s.Patch(ctx, &u, client.Apply, append([]client.PatchOption{client.FieldOwner("kubectl")}, opts...)...); err != nil {
			t.Fatalf("server-side apply %s: %v", file, err)
		}
		testbin.WaitCtx(t, ctx, 100*time.Millisecond, "the CRD established", func() bool {
			var crd apiextv1.CustomResourceDefinition
			if err := admin(t).Get(ctx, client.ObjectKey{Name: u.GetName()}, &crd); err != nil {
				return false
			}
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextv1.Established && c.Status == apiextv1.ConditionTrue {
					return true
				}
			}
			return false
		})
	}
	defer apply(filepath.Join(root, "deploy", "crds", "routing.modelsphere.dev_modelroutes.yaml"))
	// The package's control plane installed the current CRD under its own
	// field manager: take it over as the 0.1.0 install (force), as if the
	// cluster had only ever seen 0.1.0.
	apply(filepath.Join(root, "testdata", "upgrade", "crd-0.1.0.yaml"), client.ForceOwnership)

	must(t, k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "llm-route"}}))
	b, err := os.ReadFile(filepath.Join(root, "testdata", "upgrade", "modelroute-llm-0.1.0.yaml"))
	must(t, err)
	var old unstructured.Unstructured
	must(t, yaml.Unmarshal(b, &old.Object))
	must(t, k8s.Create(ctx, &old))
	// The status 0.1.0 wrote, with its since-retired backendEndpoints.
	must(t, unstructured.SetNestedField(old.Object, map[string]any{"backends": int64(2), "backendEndpoints": []any{"10.0.0.1:8000"}}, "status"))
	must(t, k8s.Status().Update(ctx, &old))

	apply(filepath.Join(root, "deploy", "crds", "routing.modelsphere.dev_modelroutes.yaml"))

	c := admin(t)
	var rt v1alpha1.ModelRoute
	must(t, c.Get(ctx, client.ObjectKeyFromObject(&old), &rt))
	v, err := schema.Default()
	must(t, err)
	// One documented break (CHANGELOG, upgrade notes): 0.1.0 let a route
	// set the engine option tps_limit_tps both in spec.slo and in values;
	// now that is refused (InvalidSpec) until one is removed. Nothing else
	// of the 0.1.0 sample may have become invalid.
	_, err = v.ValidateObject(&rt)
	var inv *schema.InvalidError
	if !errors.As(err, &inv) || len(inv.Problems) != 1 || inv.Problems[0].Path != "spec.slo.decodeTokensPerSecond" {
		t.Fatalf("the 0.1.0 sample under the new schema: %v; want exactly the documented tps_limit_tps break", err)
	}
	delete(rt.Spec.Nginx.Values, "tps_limit_tps")
	if _, err := v.ValidateObject(&rt); err != nil {
		t.Errorf("the 0.1.0 sample without tps_limit_tps is invalid: %v", err)
	}
	must(t, c.Update(ctx, &rt))
	rt.Status.Backends = 3
	rt.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Reconciled", Message: "ok", LastTransitionTime: metav1.Now()}}
	if err := c.Status().Update(ctx, &rt); err != nil {
		t.Errorf("status update under the new CRD: %v", err)
	}
	must(t, c.Delete(ctx, &rt))
}

// routeScheme has client-go's kinds, the ModelRoute and the CRD.
func routeScheme(t *testing.T) *k8sruntime.Scheme {
	t.Helper()
	sch := k8sruntime.NewScheme()
	must(t, clientgoscheme.AddToScheme(sch))
	must(t, v1alpha1.AddToScheme(sch))
	must(t, apiextv1.AddToScheme(sch))
	return sch
}

// admin is an administrator's client with routeScheme.
func admin(t *testing.T) client.Client {
	t.Helper()
	c, err := client.New(testCfg, client.Options{Scheme: routeScheme(t)})
	must(t, err)
	return c
}
