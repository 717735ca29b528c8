package controller

// This file: the scale-to-zero step (spec.scaleToZero). After the
// consumers step has read the nginx consumer pods' served reports, it
// sums the held requests and last requests their engines report for the
// route and lets package scaler decide: wake the target (its scale
// subresource to wakeReplicas) when requests wait at 0 replicas; with
// idleAfter, scale it to 0 once idle. The condition ScaleToZero says
// where the target stands.

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/scaler"
	"github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TypeScaleToZero is the condition of a route with spec.scaleToZero: True
// while the controller may wake and idle its target, False when it
// cannot (the target is missing) or refuses idleAfter (another
// autoscaler owns the replica count).
const TypeScaleToZero = "ScaleToZero"

// ScaleToZero condition reasons and event reasons.
const (
	// ReasonAwake: the target has replicas.
	ReasonAwake = "Awake"
	// ReasonAsleep: the target is at 0 replicas; requests are held and
	// wake it.
	ReasonAsleep = "Asleep"
	// ReasonWoken (event): a held request woke the target.
	ReasonWoken = "Woken"
	// ReasonIdleAfterRefused: another autoscaler targets the workload,
	// so idleAfter is not applied.
	ReasonIdleAfterRefused = "IdleAfterRefused"
	// ReasonTargetNotFound: the target workload does not exist.
	ReasonTargetNotFound = "TargetNotFound"
)

// scaleStep is the reconcile step of scale to zero.
type scaleStep struct{ r *Reconciler }

func (s scaleStep) run(ctx context.Context, st *state) (bool, error) {
	r := s.r
	key := client.ObjectKeyFromObject(st.route)
	if st.spec == nil || st.spec.Spec.ScaleToZero == nil {
		meta.RemoveStatusCondition(&st.route.Status.Conditions, TypeScaleToZero)
		if r.scaler != nil {
			r.scaler.Asleep(key)
		}
		return false, nil
	}
	if r.preview || r.scaler == nil || len(st.unwatched) > 0 {
		return false, nil
	}
	spec := st.spec.Spec.ScaleToZero
	ns := scaler.Namespace(&st.spec.Spec, st.route.Namespace)
	what := fmt.Sprintf("%s %s/%s", spec.Target.Kind, ns, spec.Target.Name)
	replicas, err := r.scaler.Replicas(ctx, ns, spec.Target)
	if apierrors.IsNotFound(err) {
		setCondition(st.route, TypeScaleToZero, metav1.ConditionFalse, ReasonTargetNotFound, fmt.Sprintf(
			"%s (spec.scaleToZero.target) does not exist, or has no scale subresource: create it or correct the target; requests at zero are held until holdTimeout and then refused", what))
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the scale of %s: %w", what, err)
	}
	now := time.Now()
	demand := scaler.Aggregate(st.reports, compiler.RouteName(compilerRoute(st.spec)))
	var others []string
	if spec.IdleAfter != "" {
		if others, err = r.scaler.Autoscalers(ctx, ns, spec.Target); err != nil {
			return false, err
		}
	}
	var awake time.Time
	if replicas > 0 {
		awake = r.scaler.MarkAwake(key, now, false)
	} else {
		r.scaler.Asleep(key)
	}
	d := scaler.Decide(scaler.Input{Spec: spec, Replicas: replicas, Demand: demand, Autoscalers: others, Awake: awake, Now: now, Granularity: served.DemandGranularity})
	if d.Scale {
		if err := r.scaler.SetReplicas(ctx, ns, spec.Target, d.Replicas); err != nil {
			return false, fmt.Errorf("scale %s to %d: %w", what, d.Replicas, err)
		}
		reason := ReasonWoken
		if d.Replicas == 0 {
			reason = compiler.ReasonScaledToZero
			r.scaler.Asleep(key)
		} else {
			r.scaler.MarkAwake(key, now, true)
		}
		ctrl.LoggerFrom(ctx).Info("scale to zero", "target", what, "replicas", d.Replicas, "why", d.Why)
		if r.Recorder != nil {
			r.Recorder.Eventf(st.route, nil, corev1.EventTypeNormal, reason, "Scale", "%s: %s", what, d.Why)
		}
		replicas = d.Replicas
	}
	if d.After > 0 {
		st.requeueAfter = d.After
	}
	switch {
	case len(d.IdleRefused) > 0:
		setCondition(st.route, TypeScaleToZero, metav1.ConditionFalse, ReasonIdleAfterRefused, fmt.Sprintf(
			"%s is also scaled by %s: idleAfter is not applied (two owners of one replica count fight); waking from zero still works. Remove spec.scaleToZero.idleAfter, or the other autoscaler", what, strings.Join(d.IdleRefused, ", ")))
	case replicas == 0:
		setCondition(st.route, TypeScaleToZero, metav1.ConditionTrue, ReasonAsleep, fmt.Sprintf(
			"%s is at 0 replicas: a request is held (up to holdTimeout %s) and wakes it to %d", what, holdTimeout(spec), wakeReplicas(spec)))
	default:
		msg := fmt.Sprintf("%s has %d replicas", what, replicas)
		if spec.IdleAfter != "" {
			msg += fmt.Sprintf("; scaled to 0 after %s without a request", spec.IdleAfter)
		}
		setCondition(st.route, TypeScaleToZero, metav1.ConditionTrue, ReasonAwake, msg)
	}
	return false, nil
}

func holdTimeout(s *v1alpha1.ScaleToZero) string {
	if s.HoldTimeout == "" {
		return "300s"
	}
	return s.HoldTimeout
}

func wakeReplicas(s *v1alpha1.ScaleToZero) int32 {
	if s.WakeReplicas < 1 {
		return 1
	}
	return s.WakeReplicas
}

// scaledToZeroMessage is the Ready message of a route at zero endpoints.
func scaledToZeroMessage(route *v1alpha1.ModelRoute) string {
	s := route.Spec.ScaleToZero
	return fmt.Sprintf("no ready endpoint: the engine holds requests (up to %s) while %s %s/%s is woken",
		holdTimeout(s), s.Target.Kind, scaler.Namespace(&route.Spec, route.Namespace), s.Target.Name)
}
