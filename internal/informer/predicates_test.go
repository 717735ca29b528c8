package informer

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/internal/served"
)

// TestGPULabelChanged: a node of the informer's first list is not mapped
// (the first lists of slices, Services and pods queue the same routes),
// a node created later is, and so is a changed GPU label; other node
// changes and deletions are not.
func TestGPULabelChanged(t *testing.T) {
	p := GPULabelChanged()
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

// TestPodChanged: a pod update passes when a field discovery reads
// changed, not when only the resourceVersion or an unread field did.
func TestPodChanged(t *testing.T) {
	p := podChanged()
	base := func() *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "llm", ResourceVersion: "1", Labels: map[string]string{"app": "vllm"}},
			Spec:       corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "a", Ports: []corev1.ContainerPort{{ContainerPort: 8000}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.0.1", PodIPs: []corev1.PodIP{{IP: "10.1.0.1"}},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}
	}
	for _, c := range []struct {
		what   string
		change func(*corev1.Pod)
		passes bool
	}{
		{"resourceVersion only", func(p *corev1.Pod) { p.ResourceVersion = "2" }, false},
		{"an unread field (image, host IP)", func(p *corev1.Pod) { p.Spec.Containers[0].Image = "b"; p.Status.HostIP = "192.168.0.1" }, false},
		{"a label", func(p *corev1.Pod) { p.Labels = map[string]string{"app": "other"} }, true},
		{"the IP", func(p *corev1.Pod) { p.Status.PodIP, p.Status.PodIPs = "10.1.0.2", []corev1.PodIP{{IP: "10.1.0.2"}} }, true},
		{"Ready", func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }, true},
		{"a container port", func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = 8001 }, true},
		{"deletion", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{} }, true},
		{"the served report", func(p *corev1.Pod) { p.Annotations = map[string]string{served.Annotation: "{}"} }, true},
	} {
		now := base()
		c.change(now)
		if got := p.Update(event.UpdateEvent{ObjectOld: base(), ObjectNew: now}); got != c.passes {
			t.Errorf("%s: passes %v, want %v", c.what, got, c.passes)
		}
	}
}
