package controller

import (
	"github.com/modelsphere/autoconfig/compiler"

	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// Condition types, as kstatus reads them: Ready is the summary; Reconciling
// (work in progress or waiting for the cluster) and Stalled (cannot progress
// without a change by someone) are present only while true.
const (
	TypeReady       = "Ready"
	TypeReconciling = "Reconciling"
	TypeStalled     = "Stalled"
	// TypeDegraded: Ready as it is, but part of the route is not rendered
	// (a tier skipped); present only while true.
	TypeDegraded = "Degraded"
)

// Condition reasons.
const (
	// ReasonReconciled: every output holds the current rendering.
	ReasonReconciled = "Reconciled"
	// ReasonNoBackends: discovery found no backends; the last good output
	// is kept (an empty list is never written).
	ReasonNoBackends = "NoBackends"
	// ReasonOutputConfigMapMissing: an output ConfigMap does not exist
	// (never created by autoconfig; written when it appears).
	ReasonOutputConfigMapMissing = "OutputConfigMapMissing"
	// ReasonInvalidSpec: the spec breaks the schema.
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonNotPermitted: an output ConfigMap in another namespace does not
	// allow the route's namespace.
	ReasonNotPermitted = "NotPermitted"
	// ReasonPortNotDerivable: discovery cannot tell which port to use.
	ReasonPortNotDerivable = "PortNotDerivable"
	// ReasonCompileFailed: the compiler refused the snapshot.
	ReasonCompileFailed = "CompileFailed"
	// ReasonRenderFailed: an output could not be rendered from the
	// ConfigMap's current content (e.g. CART base config missing).
	ReasonRenderFailed = "OutputRenderFailed"
	// ReasonRetrying: a transient error; the workqueue retries with backoff.
	ReasonRetrying = "Retrying"
	// ReasonServiceNotFound: spec.discovery.service does not exist.
	ReasonServiceNotFound = "ServiceNotFound"
	// ReasonNamespaceNotWatched: the route references a namespace outside
	// the controller's --namespace list.
	ReasonNamespaceNotWatched = "NamespaceNotWatched"
	// ReasonOutputConflict: another route owns (or has the better claim
	// to) a key this route renders; this route writes nothing there.
	ReasonOutputConflict = "OutputConflict"
	// ReasonOutputKeyForeign: a key this route renders exists without an
	// ownership mark (hand-written); left untouched without the route's
	// adopt-foreign-keys annotation.
	ReasonOutputKeyForeign = "OutputKeyForeign"
	// ReasonMonitorInNginxConfigMap: the monitor output ConfigMap is
	// another route's nginx output ConfigMap (openresty would load the
	// monitor file). The route's own, in any spelling, is InvalidSpec: the
	// schema resolves bare names with the route's namespace.
	ReasonMonitorInNginxConfigMap = "MonitorInNginxConfigMap"
	// ReasonOutputTooLarge: the write would take a ConfigMap over 1 MiB.
	ReasonOutputTooLarge = "OutputTooLarge"
	// ReasonOutputRejected: the API server refused the written ConfigMap
	// as invalid (not a stale read); the same write is not sent again.
	ReasonOutputRejected = "OutputRejected"
	// ReasonOutputForbidden: the API server refused the controller's
	// read or write of an output ConfigMap (RBAC).
	ReasonOutputForbidden = "OutputForbidden"
	// ReasonTierSkipped (condition Degraded): a spec.nginx.peers entry
	// renders no tier (e.g. the CART Service is missing or headless).
	ReasonTierSkipped = "TierSkipped"
	// ReasonCanaryNoBackends (condition Degraded): spec.canary is set but
	// its discovery finds no endpoints, so every request falls through to
	// the stable version.
	ReasonCanaryNoBackends = compiler.ReasonCanaryNoBackends
)

// Condition reasons of ScaleToZero (and events of scale to zero).
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
	// ReasonTargetNotSelected: the target is not the workload behind
	// spec.discovery (its pods are not the route's); nothing is scaled.
	ReasonTargetNotSelected = "TargetNotSelected"
	// ReasonScaleBlocked: the route is blocked (Ready False for a reason
	// that means it is not the controller's to serve: a grant missing, a
	// Service missing, a namespace not watched); nothing is scaled.
	ReasonScaleBlocked = "ScaleBlocked"
)

// problem is one thing that keeps a route from Ready. waiting: the cluster
// will fix it by itself (Reconciling), else someone must act (Stalled).
type problem struct {
	reason, msg string
	waiting     bool
	// scope is what the problem holds back: ConfigMaps ("ns/name") and
	// keys ("ns/name|key"); empty = the whole route (nothing is written).
	scope []string
}

// precedence orders reasons for the Ready condition when a reconcile finds
// several problems (all of them are in its message): the ones that explain
// the others first.
var precedence = []string{
	ReasonNamespaceNotWatched, ReasonServiceNotFound, ReasonPortNotDerivable, ReasonNoBackends,
	ReasonCompileFailed, ReasonMonitorInNginxConfigMap, ReasonOutputConfigMapMissing, ReasonNotPermitted, ReasonOutputForbidden, ReasonOutputConflict,
	ReasonOutputKeyForeign, ReasonOutputTooLarge, ReasonOutputRejected, ReasonRenderFailed,
}

// block records a problem that holds back the whole route.
func (st *state) block(reason, msg string, waiting bool) {
	st.problems = append(st.problems, problem{reason: reason, msg: msg, waiting: waiting})
}

// blockAt records a problem that holds back only the ConfigMaps or keys
// of scope.
func (st *state) blockAt(reason, msg string, waiting bool, scope ...string) {
	st.problems = append(st.problems, problem{reason: reason, msg: msg, waiting: waiting, scope: scope})
}

// sortedProblems are problems ordered by precedence (stable).
func sortedProblems(problems []problem) []problem {
	ps := slices.Clone(problems)
	slices.SortStableFunc(ps, func(a, b problem) int {
		return slices.Index(precedence, a.reason) - slices.Index(precedence, b.reason)
	})
	return ps
}

// report sets Ready from the problems: True when there are none, else
// False with the first reason by precedence and every problem's message.
func report(st *state) {
	if len(st.problems) == 0 {
		markReady(st)
		return
	}
	ps := sortedProblems(st.problems)
	msg := ps[0].msg
	if len(ps) > 1 {
		parts := make([]string, len(ps))
		for i, p := range ps {
			parts[i] = p.reason + ": " + p.msg
		}
		msg = fmt.Sprintf("%d problems: %s", len(ps), strings.Join(parts, "; "))
	}
	if ps[0].waiting {
		markWaiting(st.route, ps[0].reason, msg)
	} else {
		markStalled(st.route, ps[0].reason, msg)
	}
}

// markDegraded sets or clears Degraded from the compiled tiers and the
// canary's state (canary: why the canary serves nothing, "" when it does
// or the route has none). Skipped tiers name the reason when both hold.
func markDegraded(route *v1alpha1.ModelRoute, skipped []string, canary string) {
	reason := ReasonTierSkipped
	if len(skipped) == 0 {
		reason = ReasonCanaryNoBackends
	}
	if canary != "" {
		skipped = append(skipped, canary)
	}
	if len(skipped) == 0 {
		meta.RemoveStatusCondition(&route.Status.Conditions, TypeDegraded)
		return
	}
	setCondition(route, TypeDegraded, metav1.ConditionTrue, reason, strings.Join(skipped, "; "))
}

func setCondition(route *v1alpha1.ModelRoute, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&route.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: truncate(msg),
		ObservedGeneration: route.Generation,
	})
}

// markReady: everything written.
func markReady(st *state) {
	route := st.route
	msg := fmt.Sprintf("%d backends written to %d outputs", len(st.snap.Backends), len(st.result.Outputs))
	if len(st.result.Warnings) > 0 {
		msg += "; " + strings.Join(st.result.Warnings, "; ")
	}
	reason := ReasonReconciled
	if st.result.ScaledToZero {
		reason = compiler.ReasonScaledToZero
		msg = scaledToZeroMessage(st.spec) + "; " + msg
	}
	setCondition(route, TypeReady, metav1.ConditionTrue, reason, msg)
	meta.RemoveStatusCondition(&route.Status.Conditions, TypeReconciling)
	meta.RemoveStatusCondition(&route.Status.Conditions, TypeStalled)
	route.Status.ObservedGeneration = route.Generation
}

// markStalled: cannot progress until the spec or a ConfigMap changes.
func markStalled(route *v1alpha1.ModelRoute, reason, msg string) {
	setCondition(route, TypeReady, metav1.ConditionFalse, reason, msg)
	setCondition(route, TypeStalled, metav1.ConditionTrue, reason, msg)
	meta.RemoveStatusCondition(&route.Status.Conditions, TypeReconciling)
	route.Status.ObservedGeneration = route.Generation
}

// markWaiting: healthy spec, waiting for the cluster (e.g. backends).
func markWaiting(route *v1alpha1.ModelRoute, reason, msg string) {
	setCondition(route, TypeReady, metav1.ConditionFalse, reason, msg)
	setCondition(route, TypeReconciling, metav1.ConditionTrue, reason, msg)
	meta.RemoveStatusCondition(&route.Status.Conditions, TypeStalled)
	route.Status.ObservedGeneration = route.Generation
}

// markRetrying: a transient error; Ready keeps its last status (the outputs
// written before are still in place) unless it was never set.
func markRetrying(route *v1alpha1.ModelRoute, err error) {
	if meta.FindStatusCondition(route.Status.Conditions, TypeReady) == nil {
		setCondition(route, TypeReady, metav1.ConditionUnknown, ReasonRetrying, err.Error())
	}
	setCondition(route, TypeReconciling, metav1.ConditionTrue, ReasonRetrying, err.Error())
}

func readyReason(route *v1alpha1.ModelRoute) string {
	if c := meta.FindStatusCondition(route.Status.Conditions, TypeReady); c != nil {
		return string(c.Status) + "/" + c.Reason
	}
	return ""
}

// emitTransition records one event when the Ready condition changes status
// or reason: state transitions, not every reconcile.
func (r *Reconciler) emitTransition(orig, route *v1alpha1.ModelRoute) {
	if r.Recorder == nil {
		return
	}
	before := meta.FindStatusCondition(orig.Status.Conditions, TypeReady)
	after := meta.FindStatusCondition(route.Status.Conditions, TypeReady)
	if after == nil || (before != nil && before.Status == after.Status && before.Reason == after.Reason) {
		return
	}
	typ := corev1.EventTypeNormal
	if after.Status != metav1.ConditionTrue {
		typ = corev1.EventTypeWarning
	}
	r.Recorder.Eventf(route, nil, typ, after.Reason, "Reconcile", "%s", after.Message)
}

// truncate keeps condition messages within the API's 32768-byte limit.
func truncate(s string) string {
	const max = 32000
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}
