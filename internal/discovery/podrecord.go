package discovery

import (
	"reflect"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/modelsphere/autoconfig/internal/served"
)

// PodRecord is what a pod cache keeps of a pod: the fields StripPod keeps,
// without the rest of the corev1.Pod struct. A corev1.Pod is about 1.1 KB
// of struct before any of its strings (its PodSpec and PodStatus hold
// every field of the API, set or not) and each container another 450
// bytes; a record of a pod of two containers is about 400 bytes, the
// stripped pod 2.7 KB (TestPodRecordMemory). Pod gives the stripped pod
// back, a new object each time; a record never changes once built.
type PodRecord struct {
	name, namespace, resourceVersion string
	uid                              types.UID
	apiVersion, kind                 string
	labels                           map[string]string
	deletion                         *metav1.Time
	node                             string
	containers                       []podContainer
	phase                            corev1.PodPhase
	ip                               string
	ips                              []corev1.PodIP
	// ready is the Ready condition's status (hasReady: the pod has one).
	ready    corev1.ConditionStatus
	hasReady bool
	// served is the served report annotation (hasServed: present).
	served    string
	hasServed bool
}

type podContainer struct {
	name  string
	ports []corev1.ContainerPort
}

// CompactPod is the record of pod. It shares the labels map and the IPs
// with pod (read-only, as every cached object) and nothing else large.
func CompactPod(p *corev1.Pod) *PodRecord {
	r := &PodRecord{
		name: p.Name, namespace: intern(p.Namespace), resourceVersion: p.ResourceVersion, uid: p.UID,
		apiVersion: intern(p.APIVersion), kind: intern(p.Kind),
		labels: p.Labels, deletion: p.DeletionTimestamp, node: intern(p.Spec.NodeName),
		phase: p.Status.Phase, ip: p.Status.PodIP, ips: p.Status.PodIPs,
	}
	if len(p.Spec.Containers) > 0 {
		r.containers = make([]podContainer, len(p.Spec.Containers))
		for i, c := range p.Spec.Containers {
			r.containers[i].name = c.Name
			for _, cp := range c.Ports {
				r.containers[i].ports = append(r.containers[i].ports, corev1.ContainerPort{Name: cp.Name, ContainerPort: cp.ContainerPort, Protocol: cp.Protocol})
			}
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			r.ready, r.hasReady = c.Status, true
		}
	}
	// A consumer pod's served report (its reload sidecar's), the only
	// annotation the controller reads.
	r.served, r.hasServed = p.Annotations[served.Annotation]
	return r
}

// Name is the pod's name.
func (r *PodRecord) Name() string { return r.name }

// ResourceVersion is the pod's resourceVersion.
func (r *PodRecord) ResourceVersion() string { return r.resourceVersion }

// Labels are the pod's labels (read-only).
func (r *PodRecord) Labels() map[string]string { return r.labels }

// SameExceptVersion says whether r and o hold the same pod in everything
// but the resourceVersion: their stripped pods differ in nothing else.
func (r *PodRecord) SameExceptVersion(o *PodRecord) bool {
	a, b := *r, *o
	a.resourceVersion, b.resourceVersion = "", ""
	return reflect.DeepEqual(a, b)
}

// Pod is the stripped pod: a new object, which shares the labels map and
// the IPs with the record (read-only).
func (r *PodRecord) Pod() *corev1.Pod {
	out := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: r.apiVersion, Kind: r.kind},
		ObjectMeta: metav1.ObjectMeta{
			Name: r.name, Namespace: r.namespace, UID: r.uid, ResourceVersion: r.resourceVersion,
			Labels: r.labels, DeletionTimestamp: r.deletion,
		},
		Spec: corev1.PodSpec{NodeName: r.node},
		Status: corev1.PodStatus{
			Phase: r.phase, PodIP: r.ip, PodIPs: r.ips,
		},
	}
	if len(r.containers) > 0 {
		out.Spec.Containers = make([]corev1.Container, len(r.containers))
		for i, c := range r.containers {
			out.Spec.Containers[i] = corev1.Container{Name: c.name, Ports: c.ports}
		}
	}
	if r.hasReady {
		out.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: r.ready}}
	}
	if r.hasServed {
		out.Annotations = map[string]string{served.Annotation: r.served}
	}
	return out
}
