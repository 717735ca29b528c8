package informer

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/testenv"
)

// One real apiserver + etcd for the package's tests.
var (
	testCfg    *rest.Config
	testScheme = k8sruntime.NewScheme()
	k8s        client.Client
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	if err := clientgoscheme.AddToScheme(testScheme); err != nil {
		panic(err)
	}
	_, cfg, stop, err := testenv.StartForMain()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		return 1
	}
	defer stop()
	testCfg = cfg
	k8s, err = client.New(cfg, client.Options{Scheme: testScheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// eventually polls cond until it holds or 30 s pass (a deadline, not a
// sleep that decides the outcome); cond returns a description of the
// current state for the failure message.
func eventually(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		ok, s := cond()
		last = s
		return ok, nil
	})
	if err != nil {
		t.Fatalf("timed out waiting for %s; last state: %s", what, last)
	}
}

var nsSeq atomic.Int64

// namespace creates a fresh namespace.
func namespace(t testing.TB, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%100000, nsSeq.Add(1))
	must(t, k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	return name
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// pod creates a pod with labels and container ports and sets the status
// a kubelet reports for it (IP, Ready).
func pod(t testing.TB, ns, name string, labels map[string]string, ip string, ready bool, ports ...int32) {
	t.Helper()
	c := corev1.Container{Name: "vllm", Image: "vllm"}
	for _, p := range ports {
		c.Ports = append(c.Ports, corev1.ContainerPort{ContainerPort: p})
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{c}, NodeName: "gpu-1"}}
	must(t, k8s.Create(context.Background(), p))
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}},
	}
	must(t, k8s.Status().Update(context.Background(), p))
}

// endpointSlice creates or replaces slice name of Service svc, its
// endpoints ready at ips.
func endpointSlice(t testing.TB, ns, name, svc string, family discoveryv1.AddressType, port int32, ips []string) {
	t.Helper()
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: family,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(port)}},
	}
	for _, ip := range ips {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Terminating: ptr(false)}})
	}
	must(t, k8s.Create(context.Background(), s))
}

func up(ips ...string) []string { return ips }

func ptr[T any](v T) *T { return &v }
