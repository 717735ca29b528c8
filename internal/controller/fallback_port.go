package controller

// This file: the fallback Service's port, derived by discovery's port rule.

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// port is spec.discovery.port, else the one TCP containerPort the
// selected pods declare (discovery.DerivePort, the rule discovery uses; pods
// without an IP count too: the Service selects them as well). 0 = not
// derivable yet.
func (f *fallbackService) port(ctx context.Context, route *v1alpha1.ModelRoute) (int32, error) {
	d := route.Spec.Discovery
	if d.Port != 0 {
		return d.Port, nil
	}
	sel, err := labels.Parse(d.Selector)
	if err != nil {
		return 0, nil
	}
	reader, err := f.pods(ctx, route.Namespace, d.Selector)
	if err != nil {
		return 0, err
	}
	var pods corev1.PodList
	if err := reader.List(ctx, &pods, client.InNamespace(route.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return 0, fmt.Errorf("list pods %q in %s: %w", d.Selector, route.Namespace, err)
	}
	var live []*corev1.Pod
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			live = append(live, &pods.Items[i])
		}
	}
	port, _ := discovery.DerivePort(0, discovery.PodPorts(live...))
	return port, nil
}
