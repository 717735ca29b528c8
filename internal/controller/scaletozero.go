package controller

// This file: the scale-to-zero step (spec.scaleToZero). After the
// consumers step has read the nginx consumer pods' served reports, it
// sums the held and open requests and the last requests their engines
// report for the route and lets package scaler decide: wake the target
// (its scale subresource to wakeReplicas) when requests wait at 0
// replicas on a consumer that serves the route's current output; with
// idleAfter, scale it to 0 once no request is open and the last one
// ended idleAfter ago. It acts only for a route the controller serves
// (no problem blocks it as a whole, no grant is missing) and only on the
// workload behind spec.discovery (its pod template's labels are selected
// by the discovery Service's selector, or the route's selector). The
// condition ScaleToZero says where the target stands.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/scaler"
	"github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/schema/routespec"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TypeScaleToZero is the condition of a route with spec.scaleToZero: True
// while the controller may wake and idle its target, False when it
// cannot (the route is blocked, the target is missing or is not the
// workload behind spec.discovery) or refuses idleAfter (another
// autoscaler owns the replica count).
const TypeScaleToZero = "ScaleToZero"

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
	if r.preview || r.scaler == nil {
		return false, nil
	}
	spec := st.spec.Spec.ScaleToZero
	ns := scaler.Namespace(&st.spec.Spec, st.route.Namespace)
	what := fmt.Sprintf("%s %s/%s", spec.Target.Kind, ns, spec.Target.Name)
	// refuse: the target is left as it is, and the condition says why.
	refuse := func(reason, format string, args ...any) (bool, error) {
		r.scaler.Asleep(key)
		setCondition(st.route, TypeScaleToZero, metav1.ConditionFalse, reason, what+" (spec.scaleToZero.target) "+fmt.Sprintf(format, args...))
		return false, nil
	}
	if why := scaleBlocked(st); why != "" {
		return refuse(ReasonScaleBlocked, "is neither woken nor scaled to 0: %s. The controller scales a route's workload only while it serves the route; fix the route's Ready problem first", why)
	}
	podLabels, err := r.scaler.PodLabels(ctx, ns, spec.Target)
	if apierrors.IsNotFound(err) {
		return refuse(ReasonTargetNotFound, "does not exist: create it or correct the target; requests at zero are held until holdTimeout and then refused")
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", what, err)
	}
	if why, err := r.targetBacks(ctx, st, podLabels); err != nil {
		return false, err
	} else if why != "" {
		return refuse(ReasonTargetNotSelected, "is not the workload behind the route: %s; nothing is scaled. Set spec.scaleToZero.target to the Deployment or StatefulSet whose pods spec.discovery selects", why)
	}
	replicas, err := r.scaler.Replicas(ctx, ns, spec.Target)
	if apierrors.IsNotFound(err) {
		return refuse(ReasonTargetNotFound, "has no scale subresource: correct the target; requests at zero are held until holdTimeout and then refused")
	}
	if err != nil {
		return false, fmt.Errorf("read the scale of %s: %w", what, err)
	}
	now := time.Now()
	demand := scaler.Aggregate(st.reports, compiler.RouteName(compilerRoute(st.spec)), now)
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
	if replicas == 0 && demand.Ignored > 0 && !d.Scale {
		ctrl.LoggerFrom(ctx).V(levelDebug).Info("held requests on consumer pods that do not serve the route's current output wake nothing", "target", what, "requests", demand.Ignored)
	}
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
			msg += fmt.Sprintf("; scaled to 0 once no request is open and the last ended %s ago", spec.IdleAfter)
			if d.KeptUp != "" {
				msg += "; kept up now: " + d.KeptUp
			}
		}
		setCondition(st.route, TypeScaleToZero, metav1.ConditionTrue, ReasonAwake, msg)
	}
	return false, nil
}

// scaleBlocked says why the route's target must not be scaled now: a
// problem holds back the whole route (a namespace not watched, a Service
// not granted or missing, a port that cannot be derived, a failed
// compile), or a grant of an output is missing. "" when none does.
func scaleBlocked(st *state) string {
	var why []string
	for _, p := range sortedProblems(st.problems) {
		if len(p.scope) == 0 || p.reason == ReasonNotPermitted || p.reason == ReasonOutputForbidden {
			why = append(why, "the route is "+p.reason)
		}
	}
	slices.Sort(why)
	return strings.Join(slices.Compact(why), ", ")
}

// targetBacks says why a workload whose pods carry podLabels is not the
// one behind the route's spec.discovery ("" when it is): the discovery
// Service's selector (read from the cache), or the route's selector, must
// select them. The target is in the discovery's namespace
// (scaler.Namespace), so a grant of that Service covers its own workload
// and no other.
func (r *Reconciler) targetBacks(ctx context.Context, st *state, podLabels map[string]string) (string, error) {
	d := st.spec.Spec.Discovery
	if d.Service == "" {
		sel, err := labels.Parse(d.Selector)
		if err != nil {
			return "spec.discovery.selector cannot be parsed: " + err.Error(), nil
		}
		return scaler.Backs(podLabels, sel, "spec.discovery.selector"), nil
	}
	ns, name := routespec.SplitRef(d.Service, st.route.Namespace)
	var svc corev1.Service
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &svc); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Sprintf("Service %s/%s (spec.discovery.service) does not exist", ns, name), nil
		}
		return "", fmt.Errorf("get service %s/%s: %w", ns, name, err)
	}
	var sel labels.Selector
	if len(svc.Spec.Selector) > 0 {
		sel = labels.SelectorFromSet(svc.Spec.Selector)
	}
	return scaler.Backs(podLabels, sel, fmt.Sprintf("Service %s/%s (spec.discovery.service)", ns, name)), nil
}

func holdTimeout(s *v1alpha1.ScaleToZero) string {
	if s.HoldTimeout == "" {
		return routespec.DefaultHoldTimeout
	}
	return s.HoldTimeout
}

func wakeReplicas(s *v1alpha1.ScaleToZero) int32 {
	return min(max(s.WakeReplicas, routespec.DefaultWakeReplicas), routespec.MaxWakeReplicas)
}

// scaledToZeroMessage is the Ready message of a route at zero endpoints.
func scaledToZeroMessage(route *v1alpha1.ModelRoute) string {
	s := route.Spec.ScaleToZero
	return fmt.Sprintf("no ready endpoint: the engine holds requests (up to %s) while %s %s/%s is woken",
		holdTimeout(s), s.Target.Kind, scaler.Namespace(&route.Spec, route.Namespace), s.Target.Name)
}
