package controller

// This file: writing the fallback Service: its server-side apply
// configuration, the apply, and the no-op check that skips it.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/util/csaupgrade"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// FieldOwner is the server-side apply field manager of the fallback
// Services.
const FieldOwner = Name

// applyConfig is the apply configuration of the route's fallback Service:
// exactly the fields this route decides (labels, annotation, controller
// reference, type, selector, port); the API server keeps the rest
// (clusterIP, others' labels). A non-empty uid makes the apply fail unless
// it reaches that Service (the one the route controls), and an apply
// without one creates it; ownership is forced, as the route controls the
// Service and its fields must follow the spec.
func (f *fallbackService) applyConfig(key client.ObjectKey, route *v1alpha1.ModelRoute, selector map[string]string, port int32, uid types.UID) (*corev1ac.ServiceApplyConfiguration, error) {
	gvk, err := apiutil.GVKForObject(route, f.client.Scheme())
	if err != nil {
		return nil, fmt.Errorf("own fallback service: %w", err)
	}
	spec := corev1ac.ServiceSpec().WithType(corev1.ServiceTypeClusterIP).WithSelector(selector)
	if port != 0 {
		spec.WithPorts(corev1ac.ServicePort().WithName(FallbackPortName).WithProtocol(corev1.ProtocolTCP).
			WithPort(port).WithTargetPort(intstr.FromInt32(port)))
	}
	svc := corev1ac.Service(key.Name, key.Namespace).
		WithLabels(map[string]string{ManagedByLabel: ManagedByValue}).
		WithAnnotations(map[string]string{FallbackForAnnotation: route.Namespace + "/" + route.Name}).
		WithOwnerReferences(metav1ac.OwnerReference().WithAPIVersion(gvk.GroupVersion().String()).WithKind(gvk.Kind).
			WithName(route.Name).WithUID(route.UID).WithController(true).WithBlockOwnerDeletion(true)).
		WithSpec(spec)
	if uid != "" {
		svc.WithUID(uid)
	}
	return svc, nil
}

// apply applies want (server-side apply, field owner FieldOwner)
// and returns the Service as the API server now has it.
func (f *fallbackService) apply(ctx context.Context, want *corev1ac.ServiceApplyConfiguration) (*corev1.Service, error) {
	if err := f.client.Apply(ctx, want, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return nil, err
	}
	b, err := json.Marshal(want) // the API server's answer
	if err != nil {
		return nil, err
	}
	var svc corev1.Service
	if err := json.Unmarshal(b, &svc); err != nil {
		return nil, err
	}
	return &svc, nil
}

// appliedFallback says whether svc already has every field of want, so an
// apply would change nothing (and is skipped).
func appliedFallback(svc *corev1.Service, want *corev1ac.ServiceApplyConfiguration) bool {
	if svc.Labels[ManagedByLabel] != want.Labels[ManagedByLabel] ||
		svc.Annotations[FallbackForAnnotation] != want.Annotations[FallbackForAnnotation] ||
		svc.Spec.Type != *want.Spec.Type || !maps.Equal(svc.Spec.Selector, want.Spec.Selector) {
		return false
	}
	return slices.EqualFunc(svc.Spec.Ports, want.Spec.Ports, func(x corev1.ServicePort, y corev1ac.ServicePortApplyConfiguration) bool {
		return x.Name == *y.Name && x.Protocol == *y.Protocol && x.Port == *y.Port && x.TargetPort == *y.TargetPort
	})
}

// upgradeFields hands the fields an earlier autoconfig wrote with
// create/update (manager FieldOwner, operation Update) to the apply
// manager, so an apply can also remove them: otherwise a changed port would
// be added next to the old one instead of replacing it. It reads the live
// Service (the cache holds no managed fields) and patches only when there is
// something to hand over (once per Service).
func (f *fallbackService) upgradeFields(ctx context.Context, key client.ObjectKey) error {
	var reader client.Reader = f.client
	if f.apiReader != nil {
		reader = f.apiReader
	}
	var svc corev1.Service
	if err := reader.Get(ctx, key, &svc); err != nil {
		return err
	}
	patch, err := csaupgrade.UpgradeManagedFieldsPatch(&svc, sets.New(FieldOwner), FieldOwner)
	if err != nil || patch == nil {
		return err
	}
	return f.client.Patch(ctx, &svc, client.RawPatch(types.JSONPatchType, patch))
}
