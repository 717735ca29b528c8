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
	// Backends is the number of backend endpoints written.
	Backends int32 `json:"backends"`
	// CartPeers is the number of CART endpoints discovered.
	CartPeers int32 `json:"cartPeers"`
	// Conditions: Ready, Reconciling, Stalled.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Outputs lists the ConfigMap keys the route has written and not yet
	// removed, so keys it stops rendering (a changed nginx.route, a moved
	// outputConfigMap) are removed even when the change happened while the
	// controller was down. Sorted by ConfigMap, then key.
	Outputs []OutputKeys `json:"outputs,omitempty"`
}

// OutputKeys are the keys a route owns in one ConfigMap.
type OutputKeys struct {
	// ConfigMap is "namespace/name".
	ConfigMap string `json:"configMap"`
	// Keys are the data keys, sorted.
	Keys []string `json:"keys"`
}
