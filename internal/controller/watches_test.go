package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/modelsphere/autoconfig/internal/discovery"
)

// TestGPULabelChanged: a node of the informer's first list is not mapped
// (the first lists of slices, Services and pods queue the same routes),
// a node created later is, and so is a changed GPU label; other node
// changes and deletions are not.
func TestGPULabelChanged(t *testing.T) {
	p := gpuLabelChanged()
	node := func(gpu string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Labels: map[string]string{discovery.GPUProductLabel: gpu}}}
	}
	if p.Create(event.CreateEvent{Object: node("H100"), IsInInitialList: true}) {
		t.Error("a node of the first list is mapped")
	}
	if !p.Create(event.CreateEvent{Object: node("H100")}) {
		t.Error("a node created after the first list is not mapped")
	}
	if !p.Update(event.UpdateEvent{ObjectOld: node("H100"), ObjectNew: node("A100")}) {
		t.Error("a changed GPU label is not mapped")
	}
	relabeled := node("H100")
	relabeled.Labels["zone"] = "b"
	if p.Update(event.UpdateEvent{ObjectOld: node("H100"), ObjectNew: relabeled}) {
		t.Error("another label's change is mapped")
	}
	if p.Delete(event.DeleteEvent{Object: node("H100")}) {
		t.Error("a deletion is mapped")
	}
}
