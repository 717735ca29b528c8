package testenv

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/testbin"
)

// Eventually polls cond every 20 ms until it holds or 30 s pass (a
// deadline, not a sleep that decides the outcome); cond returns a
// description of the current state for the failure message.
func Eventually(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	testbin.WaitUntil(t, 30*time.Second, 20*time.Millisecond, what, func() string {
		if ok, s := cond(); !ok {
			return "last state: " + s
		}
		return ""
	})
}

var nsSeq atomic.Int64

// Namespace creates a fresh namespace named after prefix through c.
func Namespace(t testing.TB, c client.Client, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%100000, nsSeq.Add(1))
	testbin.Must(t, c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	return name
}

// Pod creates a pod with labels and container ports on node gpu-1 and
// then sets its status as a kubelet would (there is none in envtest): IP
// and the Ready condition.
func Pod(t testing.TB, c client.Client, ns, name string, labels map[string]string, ip string, ready bool, ports ...int32) *corev1.Pod {
	t.Helper()
	ctr := corev1.Container{Name: "vllm", Image: "vllm"}
	for _, p := range ports {
		ctr.Ports = append(ctr.Ports, corev1.ContainerPort{ContainerPort: p})
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{ctr}, NodeName: "gpu-1"}}
	testbin.Must(t, c.Create(context.Background(), p))
	SetPodStatus(t, c, p, ip, ready)
	return p
}

// SetPodStatus sets p's status as a kubelet would: running at ip, Ready
// or not.
func SetPodStatus(t testing.TB, c client.Client, p *corev1.Pod, ip string, ready bool) {
	t.Helper()
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}},
	}
	testbin.Must(t, c.Status().Update(context.Background(), p))
}
