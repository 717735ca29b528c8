package informer

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/testbin"
)

// cachedPods are the pods ("ns/name", sorted) each running pod cache
// holds (a List of the cache without selector: its informer's whole
// store), what the controller keeps in memory.
func cachedPods(t testing.TB, p *PodCaches) map[PodKey][]string {
	t.Helper()
	out := map[PodKey][]string{}
	for k, e := range p.synced() {
		var l corev1.PodList
		if err := e.cache.List(context.Background(), &l, client.UnsafeDisableDeepCopy); err != nil {
			t.Fatalf("pod cache %s: %v", k, err)
		}
		keys := []string{}
		for _, p := range l.Items {
			keys = append(keys, p.Namespace+"/"+p.Name)
		}
		slices.Sort(keys)
		out[k] = keys
	}
	return out
}

// createPods creates n pods named prefix-<i> with labels, a container that
// declares port 8000 and, with ips, the status a kubelet reports for a
// running pod (IP 10.<ips>.x.y), in parallel.
func createPods(t testing.TB, ns, prefix string, n int, labels map[string]string, ips ...int) {
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
				p := benchPod(ns, name, labels)
				if err := k8s.Create(context.Background(), p); err != nil {
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
					if err := k8s.Status().Update(context.Background(), p); err != nil {
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

// benchPod is a pod shaped like a Deployment's: owner reference, template
// hash, a container with resources, env and probes; most of it is
// stripped from the cache (discovery.StripPod).
func benchPod(ns, name string, labels map[string]string) *corev1.Pod {
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

// TestPodCacheHeap measures what a pod cache keeps: POD_CACHE_HEAP=1 runs
// it (creating 2000 pods takes a while). A namespace of 2000 pods, a
// selector matching 1 % of them: the heap (after GC) of a cache of the
// whole namespace, as the controller kept before, against the cache of
// the selector.
//
//	POD_CACHE_HEAP=1 go test -run TestPodCacheHeap -v ./internal/informer/
func TestPodCacheHeap(t *testing.T) {
	if v, _ := strconv.ParseBool(os.Getenv("POD_CACHE_HEAP")); !v {
		t.Skip("set POD_CACHE_HEAP=1 to measure")
	}
	const n, matched = 2000, 20
	ns := namespace(t, "podheap")
	createPods(t, ns, "noise", n-matched, map[string]string{"app": "noise"}, 64)
	createPods(t, ns, "sel", matched, map[string]string{"app": "sel"}, 65)

	// Shared by the caches, as in the controller.
	hc, err := podCachesClient(testCfg)
	must(t, err)
	for _, shape := range []struct{ name, sel string }{
		// The small ones first: what is left of a stopped cache is
		// then small too. A selector matching nothing is the cost of
		// a cache without pods (its watcher, map and watch).
		{"selector matching none", "app=none"},
		{"selector app=sel, 1% (after)", "app=sel"},
		{"whole namespace (before)", ""},
	} {
		p := &PodCaches{cfg: testCfg, httpClient: hc, idle: time.Minute}
		before, gBefore, sBefore := testbin.HeapAfterGC(), runtime.NumGoroutine(), stackInuse()
		if _, err := p.Reader(context.Background(), ns, shape.sel); err != nil {
			t.Fatal(err)
		}
		after, gAfter, sAfter := testbin.HeapAfterGC(), runtime.NumGoroutine(), stackInuse()
		held := 0
		for _, keys := range cachedPods(t, p) {
			held += len(keys)
		}
		t.Logf("%s: %d of %d pods cached, heap +%d KiB, %d goroutines (stacks +%d KiB)", shape.name, held, n,
			(after-before)/1024, gAfter-gBefore, (int64(sAfter)-int64(sBefore))/1024)
		p.mu.Lock()
		for _, e := range p.byKey {
			e.stop()
		}
		p.mu.Unlock()
		time.Sleep(time.Second) // its goroutines end: not freed during the next
	}
}

// stackInuse is the memory of the goroutines' stacks.
func stackInuse() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.StackInuse
}
