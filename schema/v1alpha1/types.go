package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelsphere/autoconfig/schema/routespec"
)

const (
	// Group, Version and Kind of the resource.
	Group   = "routing.modelsphere.dev"
	Version = "v1alpha1"
	Kind    = "ModelRoute"
	// APIVersion is Group/Version.
	APIVersion = Group + "/" + Version

	// ModelTypeLLM renders the lua routing engine registration.
	ModelTypeLLM = routespec.ModelTypeLLM
	// ModelTypeVideo renders a plain reverse proxy.
	ModelTypeVideo = routespec.ModelTypeVideo

	// Peer uses.
	UseCart       = routespec.UseCart
	UseBackend    = routespec.UseBackend
	UseBackendSvc = routespec.UseBackendSvc

	// Failure modes.
	FailOpen  = routespec.FailOpen
	FailClose = routespec.FailClose
)

// The spec types, declared in routespec.
type (
	Spec      = routespec.Spec
	Discovery = routespec.Discovery
	Cart      = routespec.Cart
	Nginx     = routespec.Nginx
	Peer      = routespec.Peer
	Monitor   = routespec.Monitor
	SLO       = routespec.SLO
	Canary    = routespec.Canary
	Split     = routespec.Split
	// ScaleToZero and ScaleTarget are spec.scaleToZero.
	ScaleToZero = routespec.ScaleToZero
	ScaleTarget = routespec.ScaleTarget
)

// ModelRoute says how one model is routed.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ModelRoute struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   Spec   `json:"spec"`
	Status Status `json:"status,omitempty"`
}

// ModelRouteList is a list of ModelRoutes.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ModelRouteList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ModelRoute `json:"items"`
}

// Status is what the controller observed.
type Status struct {
	// ObservedGeneration is the generation the status describes.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Backends is the number of backend endpoints written (with
	// spec.canary: of the stable version, spec.discovery).
	Backends int32 `json:"backends"`
	// CanaryBackends is the number of canary backend endpoints written
	// (spec.canary.discovery); only with spec.canary.
	CanaryBackends int32 `json:"canaryBackends,omitempty"`
	// CartPeers is the number of CART endpoints discovered.
	CartPeers int32 `json:"cartPeers"`
	// Conditions: Ready (the outputs hold the current render), Applied
	// (every consumer pod serves it), Reconciling, Stalled, Degraded
	// (docs/controller.md has each reason and what to do).
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Outputs lists the ConfigMap keys the route has written and not yet
	// removed, so keys it stops rendering (a changed nginx.route, a moved
	// outputConfigMap) are removed even when the change happened while the
	// controller was down. Sorted by ConfigMap, then key.
	Outputs []OutputKeys `json:"outputs,omitempty"`
	// Consumers are the nginx entry pods (behind spec.nginx.service) and
	// what each serves of the route's keys in its nginx output ConfigMap,
	// as their reload sidecars report it (annotation
	// routing.modelsphere.dev/served). Sorted by pod, then key.
	Consumers []Consumer `json:"consumers,omitempty"`
	// Synced is "n/m": n of the m consumer pods that report what they
	// serve serve the route's current output. Empty when no pod reports.
	Synced string `json:"synced,omitempty"`
}

// Consumer states.
const (
	// ConsumerSynced: the pod serves the key's current content.
	ConsumerSynced = "Synced"
	// ConsumerStale: the pod serves another content of the key (an older
	// one, or none).
	ConsumerStale = "Stale"
	// ConsumerNotTracked: the pod does not report what it serves (no
	// reload sidecar with --pod-name).
	ConsumerNotTracked = "NotTracked"
)

// Consumer is one consumer pod and one key of the route.
type Consumer struct {
	// Pod is "namespace/name".
	Pod string `json:"pod"`
	// Key is the ConfigMap key.
	Key string `json:"key"`
	// State is Synced, Stale or NotTracked.
	State string `json:"state"`
	// Served is the content ID the pod reports for Key (the first 16 hex
	// digits of its SHA-256); empty when it reports none.
	Served string `json:"served,omitempty"`
	// Since is when the pod reported loading what it serves.
	Since *metav1.Time `json:"since,omitempty"`
}

// OutputKeys are the keys a route owns in one ConfigMap.
type OutputKeys struct {
	// ConfigMap is "namespace/name".
	ConfigMap string `json:"configMap"`
	// Keys are the data keys, sorted.
	Keys []string `json:"keys"`
}
