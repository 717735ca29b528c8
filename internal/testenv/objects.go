package testenv

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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

// CreatePods creates n pods named prefix-<i> with labels, a container that
// declares port 8000 and, with ips, the status a kubelet reports for a
// running pod (IP 10.<ips>.x.y), in parallel.
func CreatePods(t testing.TB, c client.Client, ns, prefix string, n int, labels map[string]string, ips ...int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	work := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				name := fmt.Sprintf("%s-%d", prefix, i)
				p := DeploymentPod(ns, name, labels)
				if err := c.Create(context.Background(), p); err != nil {
					errs <- err
					continue
				}
				if len(ips) > 0 {
					ip := fmt.Sprintf("10.%d.%d.%d", ips[0], i/250, i%250+1)
					p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, HostIP: "192.168.0.1",
						StartTime: &metav1.Time{Time: time.Now()},
						Conditions: []corev1.PodCondition{
							{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.ContainersReady, Status: corev1.ConditionTrue},
							{Type: corev1.PodInitialized, Status: corev1.ConditionTrue}, {Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
						ContainerStatuses: []corev1.ContainerStatus{{Name: "vllm", Ready: true, Image: "vllm/vllm-openai:v0.6.3", ContainerID: "containerd://" + name}}}
					if err := c.Status().Update(context.Background(), p); err != nil {
						errs <- err
					}
				}
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// DeploymentPod is a pod shaped like a Deployment's: owner reference, template
// hash, a container with resources, env and probes; most of it is
// stripped from the cache (discovery.PodRecord).
func DeploymentPod(ns, name string, labels map[string]string) *corev1.Pod {
	l := map[string]string{"pod-template-hash": "7d9f8b6c5d"}
	for k, v := range labels {
		l[k] = v
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: l,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs-7d9f8b6c5d", UID: "0b6f1f9e-6b1e-4a52-9a3c-3f1d2e4c5b6a"}}},
		Spec: corev1.PodSpec{NodeName: "gpu-1", Containers: []corev1.Container{{
			Name: "vllm", Image: "vllm/vllm-openai:v0.6.3",
			Args:  []string{"--model", "/models/llama-3-8b", "--port", "8000", "--tensor-parallel-size", "1"},
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}},
			Env:   []corev1.EnvVar{{Name: "HF_HOME", Value: "/models"}, {Name: "VLLM_LOGGING_LEVEL", Value: "INFO"}},
			Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")},
			},
		}}},
	}
}

// PodKeys lists the pods c holds (a cache: without deep copies) as sorted
// "namespace/name" keys.
func PodKeys(t testing.TB, c client.Reader) []string {
	t.Helper()
	var l corev1.PodList
	testbin.Must(t, c.List(context.Background(), &l, client.UnsafeDisableDeepCopy))
	keys := make([]string, 0, len(l.Items))
	for _, p := range l.Items {
		keys = append(keys, p.Namespace+"/"+p.Name)
	}
	slices.Sort(keys)
	return keys
}
