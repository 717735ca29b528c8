package controller

// This file: the fallback Service's cleanup and conflict reporting: delete
// the Service the route controls, report a foreign or forbidden one.

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// writeError turns a forbidden write into the condition (retrying
// cannot grant RBAC; the next event on the route retries) and passes other
// errors on for the workqueue's backoff.
func (f *fallbackService) writeError(route *v1alpha1.ModelRoute, key client.ObjectKey, verb string, err error) error {
	if apierrors.IsForbidden(err) {
		f.markConflict(route, ReasonServiceNotPermitted, fmt.Sprintf(
			"cannot %s fallback Service %s: %v; grant services create/patch/delete (Helm value failOpen.manageFallbackServices: true) or discover the backends by Service", verb, key, err))
		return nil
	}
	return fmt.Errorf("%s fallback service %s: %w", verb, key, err)
}

// cleanup deletes the route's fallback Service if the route
// controls it (route deleted, or no longer FailOpen+selector); a foreign
// Service of that name is left alone. Called by the finalizer too.
func (f *fallbackService) cleanup(ctx context.Context, route *v1alpha1.ModelRoute) error {
	key := client.ObjectKey{Namespace: route.Namespace, Name: FallbackServiceName(route.Name)}
	var svc corev1.Service
	if err := f.client.Get(ctx, key, &svc); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(&svc, route) {
		return nil
	}
	err := f.client.Delete(ctx, &svc, client.Preconditions{UID: &svc.UID})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone, or replaced by someone else's object
	}
	if apierrors.IsForbidden(err) {
		ctrl.LoggerFrom(ctx).Info("cannot delete fallback service: not permitted; delete it by hand", "service", key.String())
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete fallback service %s: %w", key, err)
	}
	ctrl.LoggerFrom(ctx).Info("deleted fallback service", "service", key.String())
	return nil
}

// markConflict sets the condition and emits a Warning event when
// the condition appears or changes reason (transitions, not every
// reconcile).
func (f *fallbackService) markConflict(route *v1alpha1.ModelRoute, reason, msg string) {
	before := meta.FindStatusCondition(route.Status.Conditions, TypeFallbackServiceConflict)
	setCondition(route, TypeFallbackServiceConflict, metav1.ConditionTrue, reason, msg)
	if f.recorder != nil && (before == nil || before.Status != metav1.ConditionTrue || before.Reason != reason) {
		f.recorder.Eventf(route, nil, corev1.EventTypeWarning, TypeFallbackServiceConflict, "FallbackService", "%s", msg)
	}
}

// clearFallbackConflict removes the condition.
func clearFallbackConflict(route *v1alpha1.ModelRoute) {
	meta.RemoveStatusCondition(&route.Status.Conditions, TypeFallbackServiceConflict)
}
