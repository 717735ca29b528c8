package discovery

import (
	"fmt"
	"reflect"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// fullPod is a pod with every field a stripped pod keeps set, and some it
// drops.
func fullPod(i int) *corev1.Pod {
	p := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("vllm-%05d", i), Namespace: "llm", UID: "0b6f3c1e-4d7a-4c52-9a0e-6f1d2a3b4c5d", ResourceVersion: "12345",
			Labels:            map[string]string{"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": fmt.Sprintf("model-%04d", i/10)},
			Annotations:       map[string]string{served.Annotation: `{"keys":{}}`, "kubectl.kubernetes.io/restartedAt": "now"},
			DeletionTimestamp: &metav1.Time{},
			OwnerReferences:   []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "vllm-abc"}},
		},
		Spec: corev1.PodSpec{
			NodeName: "gpu-07",
			Containers: []corev1.Container{
				{Name: "vllm", Image: "vllm/vllm-openai", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000, Protocol: corev1.ProtocolTCP, HostPort: 1}}},
				{Name: "sidecar", Env: []corev1.EnvVar{{Name: "A", Value: "B"}}},
			},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: "10.1.0.7", PodIPs: []corev1.PodIP{{IP: "10.1.0.7"}, {IP: "fd00::7"}},
			HostIP: "192.168.0.7",
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, Reason: "r", Message: "m"},
			},
		},
	}
	return p
}

// TestPodRecord: a record gives back exactly the fields the pod caches
// kept before records (identity, labels, deletion, node, container names
// and ports, phase, IPs, the Ready condition, the served report), each
// call a new object.
func TestPodRecord(t *testing.T) {
	p := fullPod(7)
	want := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "vllm-00007", Namespace: "llm", UID: "0b6f3c1e-4d7a-4c52-9a0e-6f1d2a3b4c5d", ResourceVersion: "12345",
			Labels:            map[string]string{"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": "model-0000"},
			Annotations:       map[string]string{served.Annotation: `{"keys":{}}`},
			DeletionTimestamp: &metav1.Time{},
		},
		Spec: corev1.PodSpec{
			NodeName: "gpu-07",
			Containers: []corev1.Container{
				{Name: "vllm", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000, Protocol: corev1.ProtocolTCP}}},
				{Name: "sidecar"},
			},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: "10.1.0.7", PodIPs: []corev1.PodIP{{IP: "10.1.0.7"}, {IP: "fd00::7"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
	r := CompactPod(p)
	got := r.Pod()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("record's pod:\n%+v\nwant:\n%+v", got, want)
	}
	if r.Name() != "vllm-00007" || r.ResourceVersion() != "12345" || r.Labels()["app.kubernetes.io/name"] != "vllm" {
		t.Fatalf("accessors: %q %q %v", r.Name(), r.ResourceVersion(), r.Labels())
	}
	got.Name, got.Spec.Containers[0].Name = "changed", "changed"
	if again := r.Pod(); again.Name != "vllm-00007" || again.Spec.Containers[0].Name != "vllm" {
		t.Fatalf("a change to one Pod() reached the record: %+v", again)
	}

	// No Ready condition, no served report, no containers: none comes back.
	bare := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}}}
	if got := CompactPod(bare).Pod(); got.Annotations != nil || got.Status.Conditions != nil || got.Spec.Containers != nil || got.Name != "b" {
		t.Fatalf("bare pod: %+v", got)
	}
	// A Ready condition without a status is kept as it is.
	odd := &corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady}}}}
	if got := CompactPod(odd).Pod(); len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Type != corev1.PodReady {
		t.Fatalf("Ready without status: %+v", got.Status.Conditions)
	}
}

// TestPodRecordMemory: what a pod cache keeps per pod, a record against
// the stripped corev1.Pod the caches kept before records (measured next to
// it: 2,704 and 400 bytes for this pod of two containers). A record must
// stay under a third of the pod.
func TestPodRecordMemory(t *testing.T) {
	const n = 5000
	in := make([]*corev1.Pod, n)
	for i := range in {
		in[i] = fullPod(i)
	}
	measure := func(keep func(p *corev1.Pod) any) float64 {
		held := make([]any, n)
		before := testbin.HeapAfterGC()
		for i, p := range in {
			held[i] = keep(p)
		}
		per := float64(testbin.HeapAfterGC()-before) / n
		runtime.KeepAlive(held)
		return per
	}
	records := measure(func(p *corev1.Pod) any { return CompactPod(p) })
	pods := measure(func(p *corev1.Pod) any { return CompactPod(p).Pod() })
	runtime.KeepAlive(in)
	t.Logf("per cached pod: record %.0f bytes, stripped corev1.Pod %.0f bytes", records, pods)
	if records > pods/3 {
		t.Fatalf("a record keeps %.0f bytes, the stripped pod %.0f: want at most a third", records, pods)
	}
}
