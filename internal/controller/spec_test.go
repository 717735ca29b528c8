package controller

import (
	"context"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// The CRD's CEL rules reject invalid specs at apply time (same verdicts as
// CUE), so an invalid spec cannot reach the controller through the API
// server; the step is tested directly with the real schema.
func TestReconcileSpecInvalidIsTerminal(t *testing.T) {
	v, err := schema.Default()
	if err != nil {
		t.Fatal(err)
	}
	r := &Reconciler{Validator: v, Routes: NewRouteState()}
	route := newRoute("ns", "Bad_Name", "svc", func(r *v1alpha1.ModelRoute) {
		r.Spec.Discovery.Selector = "app=x" // both service and selector
		r.Generation = 3
		r.UID = "u1"
	})
	st := &state{route: route}
	done, err := r.reconcileSpec(context.Background(), st)
	if !done || !errors.Is(err, reconcile.TerminalError(nil)) {
		t.Fatalf("done=%v err=%v; want a terminal error", done, err)
	}
	c := findCond(route, TypeStalled)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonInvalidSpec || c.ObservedGeneration != 3 || !strings.Contains(c.Message, "spec.") {
		t.Fatalf("Stalled: %+v", c)
	}
	t.Log(c.Message)

	// Cached per generation: the same generation is not validated again.
	n := validations(t)
	_, _ = r.reconcileSpec(context.Background(), &state{route: route})
	if validations(t) != n {
		t.Fatal("same generation validated twice")
	}
	route.Generation = 4
	route.Spec.Discovery.Selector = ""
	route.Name = "good"
	done, err = r.reconcileSpec(context.Background(), &state{route: route})
	if done || err != nil || validations(t) != n+1 {
		t.Fatalf("new generation: done=%v err=%v", done, err)
	}
}

func validations(t *testing.T) float64 {
	t.Helper()
	var m dtoMetric
	if err := specValidations.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// failingValidator fails as a validator that cannot read a spec does.
type failingValidator struct{}

func (failingValidator) ValidateObject(*v1alpha1.ModelRoute) (*v1alpha1.ModelRoute, error) {
	return nil, errors.New("n/q: invalid JSON")
}

// TestReconcileSpecUnreadableIsTerminal: a spec the validator cannot read
// (not a rule violation) is Stalled with a reason and not retried, since
// validation does no I/O and would fail the same way again.
func TestReconcileSpecUnreadableIsTerminal(t *testing.T) {
	r := &Reconciler{Validator: failingValidator{}, Routes: NewRouteState()}
	route := newRoute("ns", "q", "svc", func(r *v1alpha1.ModelRoute) { r.Generation, r.UID = 2, "u2" })
	done, err := r.reconcileSpec(context.Background(), &state{route: route})
	if !done || !errors.Is(err, reconcile.TerminalError(nil)) {
		t.Fatalf("done=%v err=%v; want a terminal error", done, err)
	}
	if c := findCond(route, TypeStalled); c == nil || c.Reason != ReasonInvalidSpec || !strings.Contains(c.Message, "cannot be validated: n/q: invalid JSON") {
		t.Fatalf("Stalled: %+v", c)
	}
}
