package controller

// This file: the fallback Service's index and watch: events on a Service
// named like a selector route's fallback Service reach that route.

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// fallbackKey is the index value of a selector route (any failure mode).
func fallbackKey(route *v1alpha1.ModelRoute) []string {
	if route.Spec.Discovery.Service != "" || route.Spec.Discovery.Selector == "" {
		return nil
	}
	return []string{route.Namespace + "/" + FallbackServiceName(route.Name)}
}

// SetupFallbackIndex registers IndexRouteFallbackService.
func SetupFallbackIndex(ctx context.Context, idx client.FieldIndexer) error {
	if err := idx.IndexField(ctx, &v1alpha1.ModelRoute{}, IndexRouteFallbackService, func(o client.Object) []string {
		r, ok := o.(*v1alpha1.ModelRoute)
		if !ok {
			return nil
		}
		return fallbackKey(r)
	}); err != nil {
		return fmt.Errorf("index %s: %w", IndexRouteFallbackService, err)
	}
	return nil
}
