// Package compiler renders a validated, defaulted ModelRoute plus an endpoint
// snapshot into the exact bytes of every output it owns: the openresty route
// file, the CART config.yaml workers section and the monitor lines. It is
// pure Go: no Kubernetes client and no CUE on the render path. Same input,
// byte-identical output (endpoints come sorted and unique; the compiler
// checks that rather than sorting again).
package compiler

import (
	"fmt"

	"github.com/modelsphere/autoconfig/internal/endpoints"
)

// Endpoint is one discovered endpoint (IP, port, readiness, node, GPU
// label). Lists of them must be in normal form, sorted and unique
// (internal/endpoints.Normalize, which discovery applies).
type Endpoint = endpoints.Endpoint

// ServiceVIP is a Service's ClusterIP and the port to use on it.
type ServiceVIP struct {
	IP   string `json:"ip"`
	Port int32  `json:"port"`
}

// Snapshot is what discovery found for one route.
type Snapshot struct {
	// Backends are the model's backend endpoints (discovery).
	Backends []Endpoint `json:"backends"`
	// BackendService is the discovery Service's VIP (nil in selector mode or
	// for a headless Service); it feeds the backend-svc tier.
	BackendService *ServiceVIP `json:"backendService,omitempty"`
	// CartService is the CART Service's VIP; it feeds the cart tier.
	CartService *ServiceVIP `json:"cartService,omitempty"`
	// CartPods are the CART pods (monitor router: lines).
	CartPods []Endpoint `json:"cartPods,omitempty"`
	// NginxPods are the nginx entry pods (monitor nginx: lines).
	NginxPods []Endpoint `json:"nginxPods,omitempty"`
	// CanaryBackends are the canary version's backend endpoints
	// (spec.canary.discovery); they feed the canary's backend tier.
	CanaryBackends []Endpoint `json:"canaryBackends,omitempty"`
}

// Output is one ConfigMap key this route owns.
type Output struct {
	// ConfigMap is namespace/name (bare names already resolved against the
	// route's namespace).
	ConfigMap string
	// Key is the ConfigMap data key.
	Key string
	// Render returns the key's new content given its current content
	// (nil when absent). Most outputs ignore current; the CART config.yaml
	// rewrites only the workers section of it and fails when it is missing
	// or unparsable (never overwritten).
	Render func(current []byte) ([]byte, error)
}

// Result is everything a route renders.
type Result struct {
	Outputs []Output
	// Warnings are conditions worth surfacing in status (e.g. backend-svc
	// tier skipped in selector mode).
	Warnings []string
	// Skipped are the spec.nginx.peers entries that rendered no tier
	// (also in Warnings).
	Skipped []SkippedTier
	// CanaryNoBackends: the route has spec.canary but its discovery found
	// no endpoint. Not an error (the engine serves every request from the
	// stable version and counts the fallthrough); the controller reports
	// the route Degraded with reason ReasonCanaryNoBackends (also in
	// Warnings).
	CanaryNoBackends bool
	// ScaledToZero: the route has spec.scaleToZero and no backend
	// endpoint; it rendered no tiers and its engine holds requests (the
	// controller reports reason ReasonScaledToZero and wakes the target).
	ScaledToZero bool
	// Keys are the route's keys (KeysFor with the compile's
	// Options.DynamicPeers): who their marks name, the spec field naming
	// each, the route file's ConfigMap and the monitor key.
	Keys Keys
}

// SkippedTier is a spec.nginx.peers entry that rendered no tier.
type SkippedTier struct {
	// Index in spec.nginx.peers.
	Index int
	// Use is the entry's use (cart, backend, backend-svc).
	Use string
	// Reason says why, in the user's terms.
	Reason string
}

func (s SkippedTier) String() string {
	return fmt.Sprintf("spec.nginx.peers[%d] (use: %s) skipped: %s", s.Index, s.Use, s.Reason)
}
