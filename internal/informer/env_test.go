package informer

import (
	"context"
	"fmt"
	"os"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/testbin"
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

// eventually, namespace and must are the envtest tests' shared
// fixtures (internal/testenv, internal/testbin).
var (
	eventually = testenv.Eventually
	must       = testbin.Must
)

func namespace(t testing.TB, prefix string) string { return testenv.Namespace(t, k8s, prefix) }

// pod creates a pod and sets its status as a kubelet would.
func pod(t testing.TB, ns, name string, labels map[string]string, ip string, ready bool, ports ...int32) {
	t.Helper()
	testenv.Pod(t, k8s, ns, name, labels, ip, ready, ports...)
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
