// Package discovery turns listed Kubernetes objects (EndpointSlices, Pods,
// Services, Nodes) into a compiler.Snapshot for one ModelRoute.
//
// The functions in this file are pure: they take objects and return
// endpoints, so every semantic (readiness, terminating endpoints, port
// derivation, ordering, dedup, dual stack) is unit-tested without an API
// server. index.go and reader.go are the informer glue the controller uses.
package discovery

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/endpoints"
)

// GPUProductLabel is the node label (set by NVIDIA GPU feature discovery)
// that names the GPU model of a node.
const GPUProductLabel = "nvidia.com/gpu.product"

// DispatchPortName is the named port of the nginx entry Service that carries
// the dispatch server (8080 in the openresty image).
const DispatchPortName = "dispatch"

// DefaultDispatchPort is the openresty dispatch port when it cannot be read
// from the entry Service.
const DefaultDispatchPort = 8080

// PortError says that a backend port cannot be derived; the route needs an
// explicit port. Field is the spec path to set.
type PortError struct {
	Field  string
	Reason string
}

func (e *PortError) Error() string {
	return fmt.Sprintf("%s: %s; set %s explicitly", e.Field, e.Reason, e.Field)
}

// Options say how one discovery block selects endpoints.
type Options struct {
	// Port is the configured port; 0 = derive it.
	Port int32
	// IncludeNotReady also takes endpoints that are not Ready (terminating
	// endpoints are excluded either way).
	IncludeNotReady bool
	// PortField is the spec path reported in a PortError
	// (e.g. spec.discovery.port).
	PortField string
}

// FromEndpointSlices returns the endpoints of a Service's slices: IPv4 and
// IPv6 slices alike (dual stack), in normal form (endpoints.Normalize: sorted,
// one per address and port, a Ready duplicate kept over a not-ready one).
// Terminating endpoints never count; not-ready ones only with
// IncludeNotReady. With Port unset, each slice's single port is used; a
// slice with endpoints and zero or several ports is a PortError.
func FromEndpointSlices(items []discoveryv1.EndpointSlice, o Options) ([]compiler.Endpoint, error) {
	var out []compiler.Endpoint
	for i := range items {
		s := &items[i]
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue // FQDN slices carry no routable address
		}
		port := o.Port
		for _, ep := range s.Endpoints {
			ready, ok := usable(ep.Conditions, o.IncludeNotReady)
			if !ok {
				continue
			}
			if port == 0 {
				declared := slicePorts(s)
				if port, ok = DerivePort(0, declared); !ok {
					return nil, portError(o.PortField, "EndpointSlice "+s.Namespace+"/"+s.Name, "port", declared)
				}
			}
			node := ""
			if ep.NodeName != nil {
				node = *ep.NodeName
			}
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil {
					continue
				}
				out = append(out, compiler.Endpoint{IP: ip.Unmap().String(), Port: port, Ready: ready, Node: node})
			}
		}
	}
	return endpoints.Normalize(out), nil
}

// usable applies the readiness rules to one endpoint. A nil Ready means
// ready (API contract); terminating endpoints are dropped even when they
// still serve, so a scale-in removes them at once.
func usable(c discoveryv1.EndpointConditions, includeNotReady bool) (ready, ok bool) {
	if c.Terminating != nil && *c.Terminating {
		return false, false
	}
	ready = c.Ready == nil || *c.Ready
	return ready, ready || includeNotReady
}

// DeclaredPort is a port an EndpointSlice or a pod declares.
type DeclaredPort struct {
	Name string // "" for container ports: pods are compared by number
	Port int32
}

// DerivePort is the one port rule, of discovery and of the fallback
// Service: the configured port when set, else the only port declared
// (distinct by name and number). ok is false when none or several are
// declared; portError says which.
func DerivePort(configured int32, declared []DeclaredPort) (port int32, ok bool) {
	if configured != 0 {
		return configured, true
	}
	if len(declared) != 1 {
		return 0, false
	}
	return declared[0].Port, true
}

// portError is the PortError of a failed DerivePort: owner (e.g. "pod
// llm/qwen-0") declares no noun, or several (listed by number).
func portError(field, owner, noun string, declared []DeclaredPort) *PortError {
	if len(declared) == 0 {
		return &PortError{Field: field, Reason: fmt.Sprintf("%s declares no %s", owner, noun)}
	}
	declared = slices.Clone(declared)
	slices.SortStableFunc(declared, func(a, b DeclaredPort) int { return cmp.Compare(a.Port, b.Port) })
	list := make([]string, len(declared))
	for i, p := range declared {
		list[i] = strconv.Itoa(int(p.Port))
		if p.Name != "" {
			list[i] = p.Name + "=" + list[i]
		}
	}
	return &PortError{Field: field, Reason: fmt.Sprintf("%s declares several %ss (%s)", owner, noun, strings.Join(list, ", "))}
}

// slicePorts are the ports an EndpointSlice declares.
func slicePorts(s *discoveryv1.EndpointSlice) []DeclaredPort {
	var out []DeclaredPort
	for _, p := range s.Ports {
		if p.Port == nil {
			continue
		}
		d := DeclaredPort{Port: *p.Port}
		if p.Name != nil {
			d.Name = *p.Name
		}
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// FromPods returns the pods' addresses (every status.podIPs entry: dual
// stack) with the configured port or, when unset, the pod's single
// containerPort. Pods being deleted or finished never count; pods without an
// IP yet are skipped. A usable pod whose port cannot be derived is a
// PortError naming the pod.
func FromPods(pods []corev1.Pod, o Options) ([]compiler.Endpoint, error) {
	var out []compiler.Endpoint
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ready := podReady(p)
		if !ready && !o.IncludeNotReady {
			continue
		}
		ips := podIPs(p)
		if len(ips) == 0 {
			continue
		}
		port, ok := o.Port, true
		if port == 0 {
			declared := PodPorts(p)
			if port, ok = DerivePort(0, declared); !ok {
				return nil, portError(o.PortField, "pod "+p.Namespace+"/"+p.Name, "TCP containerPort", declared)
			}
		}
		for _, ip := range ips {
			out = append(out, compiler.Endpoint{IP: ip, Port: port, Ready: ready, Node: p.Spec.NodeName})
		}
	}
	return endpoints.Normalize(out), nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podIPs(p *corev1.Pod) []string {
	var out []string
	add := func(s string) {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return
		}
		s = ip.Unmap().String()
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, ip := range p.Status.PodIPs {
		add(ip.IP)
	}
	add(p.Status.PodIP)
	return out
}

// PodPorts are the distinct TCP containerPorts the pods declare.
func PodPorts(pods ...*corev1.Pod) []DeclaredPort {
	var out []DeclaredPort
	for _, p := range pods {
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				d := DeclaredPort{Port: cp.ContainerPort}
				if (cp.Protocol == "" || cp.Protocol == corev1.ProtocolTCP) && !slices.Contains(out, d) {
					out = append(out, d)
				}
			}
		}
	}
	return out
}

// NormalizeSnapshot puts every endpoint list of a snapshot not built by
// discovery (e.g. read from a file) in normal form (endpoints.Normalize),
// as the compiler requires.
func NormalizeSnapshot(s compiler.Snapshot) compiler.Snapshot {
	s.Backends = endpoints.Normalize(s.Backends)
	s.CartPods = endpoints.Normalize(s.CartPods)
	s.NginxPods = endpoints.Normalize(s.NginxPods)
	s.CanaryBackends = endpoints.Normalize(s.CanaryBackends)
	return s
}

// HostPort formats an endpoint as ip:port, bracketing IPv6 ([fd00::1]:8000).
func HostPort(e compiler.Endpoint) string {
	return net.JoinHostPort(e.IP, strconv.Itoa(int(e.Port)))
}

// ServiceVIP returns a Service's cluster IP and the service port that
// reaches targetPort (the endpoint port): the Service's only port, else the
// port whose targetPort number or name matches (portName is the
// EndpointSlice port name), else the first port. Headless Services and
// Services without a ClusterIP have no VIP (nil).
func ServiceVIP(svc *corev1.Service, targetPort int32, portName string) *compiler.ServiceVIP {
	if svc == nil {
		return nil
	}
	ip := svc.Spec.ClusterIP
	if len(svc.Spec.ClusterIPs) > 0 {
		ip = svc.Spec.ClusterIPs[0] // primary family, as kube-proxy serves it
	}
	if ip == "" || ip == corev1.ClusterIPNone || len(svc.Spec.Ports) == 0 {
		return nil
	}
	port := svc.Spec.Ports[0].Port
	if len(svc.Spec.Ports) > 1 {
		for _, p := range svc.Spec.Ports {
			if (portName != "" && p.Name == portName) ||
				(targetPort != 0 && p.TargetPort.IntValue() == int(targetPort)) ||
				(targetPort != 0 && p.TargetPort.IntValue() == 0 && p.Port == targetPort) {
				port = p.Port
				break
			}
		}
	}
	return &compiler.ServiceVIP{IP: ip, Port: port}
}

// DispatchPort is the nginx entry's dispatch port: the slice or pod port
// named "dispatch", else the only port, else 8080. The entry is only used for
// monitor lines, so it never fails a route.
func DispatchPort(items []discoveryv1.EndpointSlice) int32 {
	var only []int32
	for _, s := range items {
		for _, p := range s.Ports {
			if p.Port == nil {
				continue
			}
			if p.Name != nil && *p.Name == DispatchPortName {
				return *p.Port
			}
			if !slices.Contains(only, *p.Port) {
				only = append(only, *p.Port)
			}
		}
	}
	if len(only) == 1 {
		return only[0]
	}
	return DefaultDispatchPort
}

// PodDispatchPort is DispatchPort for selector-discovered entry pods.
func PodDispatchPort(pods []corev1.Pod) int32 {
	var only []int32
	for _, p := range pods {
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == DispatchPortName {
					return cp.ContainerPort
				}
				if !slices.Contains(only, cp.ContainerPort) {
					only = append(only, cp.ContainerPort)
				}
			}
		}
	}
	if len(only) == 1 {
		return only[0]
	}
	return DefaultDispatchPort
}

// SlicePortName returns the name of the slices' port numbered port, for
// matching it to a Service port; "" when unnamed or absent.
func SlicePortName(items []discoveryv1.EndpointSlice, port int32) string {
	for _, s := range items {
		for _, p := range s.Ports {
			if p.Port != nil && *p.Port == port && p.Name != nil {
				return *p.Name
			}
		}
	}
	return ""
}

// FillGPU sets each endpoint's GPUProduct from its node's labels
// (nodeLabels maps node name → labels).
func FillGPU(eps []compiler.Endpoint, nodeLabels map[string]map[string]string) {
	for i := range eps {
		if l, ok := nodeLabels[eps[i].Node]; ok {
			eps[i].GPUProduct = l[GPUProductLabel]
		}
	}
}
