package controller

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// countingValidator counts the validations it runs.
type countingValidator struct {
	Validator
	n int
}

func (v *countingValidator) ValidateObject(r *v1alpha1.ModelRoute) (*v1alpha1.ModelRoute, error) {
	v.n++
	return v.Validator.ValidateObject(r)
}

// TestSpecCacheKeepsOnlyTheSpec: the spec cache validates a generation
// once and keeps the route's name, namespace and validated spec (what the
// reconcile reads of it), none of its metadata or status.
func TestSpecCacheKeepsOnlyTheSpec(t *testing.T) {
	s, err := schema.Default()
	must(t, err)
	v := &countingValidator{Validator: s}
	route := newRoute("llm", "qwen", "qwen")
	route.UID, route.Generation, route.ResourceVersion = "uid-1", 3, "17"
	route.Annotations = map[string]string{"example.com/note": "x"}
	route.Labels = map[string]string{"app": "qwen"}
	route.Finalizers = []string{Finalizer}
	route.Status.Conditions = []metav1.Condition{{Type: TypeReady, Status: metav1.ConditionTrue, Reason: ReasonReconciled, Message: "ok"}}
	route.Status.Outputs = []v1alpha1.OutputKeys{{ConfigMap: "llm/routes", Keys: []string{routeKey("qwen")}}}

	var c specCache
	got, err := c.validate(v, route)
	must(t, err)
	full, err := s.ValidateObject(route)
	must(t, err)
	want := &v1alpha1.ModelRoute{TypeMeta: full.TypeMeta, ObjectMeta: metav1.ObjectMeta{Name: "qwen", Namespace: "llm"}, Spec: full.Spec}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("cached\n %+v\nwant\n %+v", got, want)
	}
	again, err := c.validate(v, route)
	must(t, err)
	if again != got || v.n != 1 {
		t.Fatalf("the same generation validated %d times (same entry: %v)", v.n, again == got)
	}
	route.Generation++
	if _, err := c.validate(v, route); err != nil || v.n != 2 {
		t.Fatalf("a new generation: %d validations, %v", v.n, err)
	}
}
