package discovery

import (
	"errors"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/modelsphere/autoconfig/compiler"
)

func ptr[T any](v T) *T { return &v }

// ep builds an endpoint: ready/terminating as given, one address.
func ep(addr string, ready, terminating *bool, node string) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ready, Terminating: terminating}}
	if node != "" {
		e.NodeName = ptr(node)
	}
	return e
}

func slice(name string, at discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
	return discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "llm"},
		AddressType: at,
		Ports:       ports,
		Endpoints:   eps,
	}
}

func port(name string, p int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr(name), Port: ptr(p)}
}

var (
	yes = ptr(true)
	no  = ptr(false)
)

func TestFromEndpointSlicesReadiness(t *testing.T) {
	s := slice("a", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("http", 8000)},
		ep("10.0.0.3", yes, nil, "n1"),
		ep("10.0.0.1", nil, nil, "n1"), // nil Ready means ready
		ep("10.0.0.2", no, nil, "n2"),  // not ready
		ep("10.0.0.4", no, yes, "n2"),  // terminating
		ep("10.0.0.5", yes, yes, "n2"), // terminating but still serving
	)
	got, err := FromEndpointSlices([]discoveryv1.EndpointSlice{s}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []compiler.Endpoint{
		{IP: "10.0.0.1", Port: 8000, Ready: true, Node: "n1"},
		{IP: "10.0.0.3", Port: 8000, Ready: true, Node: "n1"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ready only:\n got %+v\nwant %+v", got, want)
	}

	got, err = FromEndpointSlices([]discoveryv1.EndpointSlice{s}, Options{IncludeNotReady: true})
	if err != nil {
		t.Fatal(err)
	}
	want = []compiler.Endpoint{
		{IP: "10.0.0.1", Port: 8000, Ready: true, Node: "n1"},
		{IP: "10.0.0.2", Port: 8000, Ready: false, Node: "n2"},
		{IP: "10.0.0.3", Port: 8000, Ready: true, Node: "n1"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("includeNotReady (terminating still excluded):\n got %+v\nwant %+v", got, want)
	}
}

func TestFromEndpointSlicesDualStackDedupOrder(t *testing.T) {
	ports := []discoveryv1.EndpointPort{port("http", 8000)}
	v6 := slice("b-v6", discoveryv1.AddressTypeIPv6, ports, ep("fd00::10", yes, nil, ""), ep("fd00::2", yes, nil, ""))
	v4a := slice("b-1", discoveryv1.AddressTypeIPv4, ports, ep("10.0.0.10", yes, nil, ""), ep("10.0.0.9", no, nil, ""))
	// The same endpoint in two slices (a slice split in progress): once,
	// and Ready wins.
	v4b := slice("b-2", discoveryv1.AddressTypeIPv4, ports, ep("10.0.0.9", yes, nil, "n9"), ep("10.0.0.10", yes, nil, ""))
	fqdn := slice("b-fqdn", discoveryv1.AddressTypeFQDN, ports, ep("example.com", yes, nil, ""))
	want := []compiler.Endpoint{
		{IP: "10.0.0.9", Port: 8000, Ready: true, Node: "n9"},
		{IP: "10.0.0.10", Port: 8000, Ready: true},
		{IP: "fd00::2", Port: 8000, Ready: true},
		{IP: "fd00::10", Port: 8000, Ready: true},
	}
	for _, order := range [][]discoveryv1.EndpointSlice{{v6, v4a, v4b, fqdn}, {fqdn, v4b, v4a, v6}} {
		got, err := FromEndpointSlices(order, Options{IncludeNotReady: true})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("\n got %+v\nwant %+v", got, want)
		}
	}
	if hp := HostPort(want[2]); hp != "[fd00::2]:8000" {
		t.Fatalf("HostPort IPv6 = %q", hp)
	}
}

func TestFromEndpointSlicesPort(t *testing.T) {
	one := []discoveryv1.EndpointPort{port("http", 8000)}
	two := []discoveryv1.EndpointPort{port("http", 8000), port("metrics", 9000)}
	e := ep("10.0.0.1", yes, nil, "")

	// Explicit port wins over the slice's ports.
	got, err := FromEndpointSlices([]discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, two, e)}, Options{Port: 9000})
	if err != nil || len(got) != 1 || got[0].Port != 9000 {
		t.Fatalf("explicit port: %+v %v", got, err)
	}
	got, err = FromEndpointSlices([]discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, one, e)}, Options{})
	if err != nil || len(got) != 1 || got[0].Port != 8000 {
		t.Fatalf("derived port: %+v %v", got, err)
	}
	for name, ports := range map[string][]discoveryv1.EndpointPort{"several": two, "none": nil} {
		_, err = FromEndpointSlices([]discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, ports, e)}, Options{PortField: "spec.discovery.port"})
		var pe *PortError
		if !errors.As(err, &pe) || pe.Field != "spec.discovery.port" {
			t.Fatalf("%s ports: want PortError, got %v", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
	// A slice without usable endpoints does not need a port.
	got, err = FromEndpointSlices([]discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4, two, ep("10.0.0.2", no, nil, ""))}, Options{})
	if err != nil || len(got) != 0 {
		t.Fatalf("no usable endpoints: %+v %v", got, err)
	}
}

func pod(name string, ready bool, ips []string, ports ...int32) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm"}, Spec: corev1.PodSpec{NodeName: "n1"}}
	c := corev1.Container{Name: "c"}
	for _, port := range ports {
		c.Ports = append(c.Ports, corev1.ContainerPort{ContainerPort: port})
	}
	p.Spec.Containers = []corev1.Container{c}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
	for i, ip := range ips {
		if i == 0 {
			p.Status.PodIP = ip
		}
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return p
}

func TestFromPods(t *testing.T) {
	deleting := pod("d", true, []string{"10.1.0.9"}, 8000)
	deleting.DeletionTimestamp = &metav1.Time{}
	failed := pod("f", true, []string{"10.1.0.8"}, 8000)
	failed.Status.Phase = corev1.PodFailed
	pods := []corev1.Pod{
		pod("b", true, []string{"10.1.0.2", "fd00::2"}, 8000),
		pod("a", true, []string{"10.1.0.1"}, 8000),
		pod("n", false, []string{"10.1.0.3"}, 8000),
		pod("pending", true, nil, 8000),
		deleting, failed,
	}
	got, err := FromPods(pods, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []compiler.Endpoint{
		{IP: "10.1.0.1", Port: 8000, Ready: true, Node: "n1"},
		{IP: "10.1.0.2", Port: 8000, Ready: true, Node: "n1"},
		{IP: "fd00::2", Port: 8000, Ready: true, Node: "n1"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("\n got %+v\nwant %+v", got, want)
	}
	got, _ = FromPods(pods, Options{IncludeNotReady: true})
	if len(got) != 4 {
		t.Fatalf("includeNotReady: %+v", got)
	}
	for _, bad := range []corev1.Pod{pod("x", true, []string{"10.1.0.5"}), pod("y", true, []string{"10.1.0.5"}, 8000, 9000)} {
		_, err := FromPods([]corev1.Pod{bad}, Options{PortField: "spec.discovery.port"})
		var pe *PortError
		if !errors.As(err, &pe) {
			t.Fatalf("pod %s: want PortError, got %v", bad.Name, err)
		}
		t.Log(err)
	}
	got, err = FromPods([]corev1.Pod{pod("y", true, []string{"10.1.0.5"}, 8000, 9000)}, Options{Port: 9000})
	if err != nil || got[0].Port != 9000 {
		t.Fatalf("explicit port: %+v %v", got, err)
	}
}

func TestServiceVIP(t *testing.T) {
	svc := &corev1.Service{Spec: corev1.ServiceSpec{
		ClusterIP:  "10.96.0.10",
		ClusterIPs: []string{"10.96.0.10", "fd00:96::10"},
		Ports: []corev1.ServicePort{
			{Name: "metrics", Port: 9090, TargetPort: intstr.FromInt32(9000)},
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8000)},
		},
	}}
	if v := ServiceVIP(svc, 8000, ""); v == nil || *v != (compiler.ServiceVIP{IP: "10.96.0.10", Port: 80}) {
		t.Fatalf("by target port: %+v", v)
	}
	svc.Spec.Ports[1].TargetPort = intstr.FromString("web")
	if v := ServiceVIP(svc, 8000, "http"); v == nil || v.Port != 80 {
		t.Fatalf("by port name: %+v", v)
	}
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
	if v := ServiceVIP(svc, 8000, ""); v != nil {
		t.Fatalf("headless: %+v", v)
	}
}

func TestStripPod(t *testing.T) {
	p := pod("a", true, []string{"10.1.0.1"}, 8000)
	p.Labels = map[string]string{"app": "x"}
	p.Annotations = map[string]string{"big": "yes"}
	p.Spec.Containers[0].Image = "vllm"
	p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "A", Value: "B"}}
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue})
	o, err := StripPod(&p)
	if err != nil {
		t.Fatal(err)
	}
	s := o.(*corev1.Pod)
	if s.Annotations != nil || s.Spec.Containers[0].Image != "" || s.Spec.Containers[0].Env != nil || len(s.Status.Conditions) != 1 {
		t.Fatalf("not stripped: %+v", s)
	}
	got, err := FromPods([]corev1.Pod{*s}, Options{})
	want, _ := FromPods([]corev1.Pod{p}, Options{})
	if err != nil || !reflect.DeepEqual(got, want) || s.Labels["app"] != "x" {
		t.Fatalf("stripped pod discovers differently: %+v vs %+v (%v)", got, want, err)
	}
}
