package routespec

import "strings"

const (
	// ModelTypeLLM renders the lua routing engine registration.
	ModelTypeLLM = "llm"
	// ModelTypeVideo renders a plain reverse proxy.
	ModelTypeVideo = "video"

	// Peer uses.
	UseCart       = "cart"
	UseBackend    = "backend"
	UseBackendSvc = "backend-svc"

	// Failure modes.
	FailOpen  = "FailOpen"
	FailClose = "FailClose"
)

// Spec is the spec of a ModelRoute.
type Spec struct {
	// ModelType is llm (default) or video.
	ModelType string `json:"modelType,omitempty"`
	// Discovery says how the model's backends are found.
	Discovery Discovery `json:"discovery"`
	// Cart, when set, makes autoconfig manage the model's CART workers.
	Cart *Cart `json:"cart,omitempty"`
	// Nginx is the openresty route.
	Nginx Nginx `json:"nginx"`
	// Monitor also writes the monitoring lines.
	Monitor *Monitor `json:"monitor,omitempty"`
	// SLO holds LLM-only service targets rendered into route options.
	SLO *SLO `json:"slo,omitempty"`
	// FailureMode is FailOpen, FailClose or empty (the listed tiers only,
	// rendered as before the field existed).
	FailureMode string `json:"failureMode,omitempty"`
	// Canary, when set, splits the route between two model versions: the
	// stable one (spec.discovery) and the canary (spec.canary.discovery).
	// Absent = one version, rendered as before the field existed.
	Canary *Canary `json:"canary,omitempty"`
	// Split holds the keys that choose a request's version; only with
	// spec.canary.
	Split *Split `json:"split,omitempty"`
	// ScaleToZero, when set, lets the model have no pods: at zero ready
	// endpoints the engine holds requests while the controller wakes
	// Target. Absent = rendered as before the field existed.
	ScaleToZero *ScaleToZero `json:"scaleToZero,omitempty"`
}

// ScaleToZero is spec.scaleToZero: the workload woken when a request
// arrives at zero, how long a request waits, and when to scale back.
type ScaleToZero struct {
	// Target is the workload whose pods back spec.discovery.
	Target ScaleTarget `json:"target"`
	// WakeReplicas is the replicas a request at zero wakes Target to
	// (default 1).
	WakeReplicas int32 `json:"wakeReplicas,omitempty"`
	// HoldTimeout is how long a request waits for a first ready endpoint
	// (300s, 5m, 1h; default 300s).
	HoldTimeout string `json:"holdTimeout,omitempty"`
	// IdleAfter, when set, scales Target to 0 after no request for this
	// long; empty = never.
	IdleAfter string `json:"idleAfter,omitempty"`
}

// ScaleTarget names a Deployment or StatefulSet.
type ScaleTarget struct {
	// Kind is Deployment or StatefulSet.
	Kind string `json:"kind"`
	// Name is the workload's name.
	Name string `json:"name"`
}

// Scale-to-zero target kinds and defaults.
const (
	KindDeployment      = "Deployment"
	KindStatefulSet     = "StatefulSet"
	DefaultWakeReplicas = 1
	// MaxWakeReplicas is the schema's bound of wakeReplicas; the
	// controller never wakes a target to more.
	MaxWakeReplicas        = 1000
	DefaultHoldTimeout     = "300s"
	DefaultHoldMaxRequests = 256
)

// Seconds is the length of a scaleToZero duration (Ns, Nm or Nh, as the
// schema admits them), 0 for an empty or malformed one.
func Seconds(d string) int {
	if len(d) < 2 {
		return 0
	}
	n := 0
	for _, c := range d[:len(d)-1] {
		if c < '0' || c > '9' || n > 1e7 {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	switch d[len(d)-1] {
	case 's':
		return n
	case 'm':
		return n * 60
	case 'h':
		return n * 3600
	}
	return 0
}

// Version names of a canary route, as the override header carries them
// and the X-Model-Version response header names them.
const (
	VersionStable = "stable"
	VersionCanary = "canary"
)

// Split defaults.
const (
	DefaultStickyHeader   = "x-session-id"
	DefaultOverrideHeader = "x-model-version"
	DefaultStickyCookie   = "autoconfig-session"
)

// Canary is the second model version of a route.
type Canary struct {
	// Discovery finds the canary's backends, as spec.discovery does the
	// stable version's.
	Discovery Discovery `json:"discovery"`
	// Weight is the percent (0–100) of sessions, and of requests without
	// a session key, that the canary serves.
	Weight int32 `json:"weight"`
}

// Split says how a request's version is chosen: the override header, else
// the sticky header's (or the sticky cookie's) session key, else a
// weighted draw.
type Split struct {
	// StickyHeader carries the session key (default x-session-id).
	StickyHeader string `json:"stickyHeader,omitempty"`
	// OverrideHeader names the version to serve, stable or canary
	// (default x-model-version).
	OverrideHeader string `json:"overrideHeader,omitempty"`
	// StickyCookie is the cookie the route sets on a response to a
	// request without the sticky header, and reads when the header is
	// absent (default autoconfig-session).
	StickyCookie string `json:"stickyCookie,omitempty"`
}

// Discovery finds a set of endpoints: EndpointSlices of a Service or pods
// by label. Exactly one of Service and Selector is set.
type Discovery struct {
	// Service is name or ns/name (a bare name = the ModelRoute's namespace).
	Service string `json:"service,omitempty"`
	// Selector is a pod label selector.
	Selector string `json:"selector,omitempty"`
	// Port is the endpoint port; 0 = derived.
	Port int32 `json:"port,omitempty"`
	// IncludeNotReady also takes endpoints that are not Ready.
	IncludeNotReady bool `json:"includeNotReady,omitempty"`
}

// Cart is the cache-aware router layer of a route.
type Cart struct {
	Discovery `json:",inline"`
	// OutputConfigMap is name or ns/name of the ConfigMap with config.yaml.
	OutputConfigMap string `json:"outputConfigMap"`
	// MaxLoad is each worker's max_load (default 20).
	MaxLoad int32 `json:"maxLoad,omitempty"`
}

// Nginx is the openresty route.
type Nginx struct {
	// Route is the short name (default metadata.name).
	Route string `json:"route,omitempty"`
	// Peers are the ordered peer tiers.
	Peers []Peer `json:"peers"`
	// OutputConfigMap is name or ns/name of the routes ConfigMap.
	OutputConfigMap string `json:"outputConfigMap"`
	// Values are options rendered verbatim into register_route.
	Values map[string]string `json:"values,omitempty"`
	// Service is the nginx entry's own Service (name or ns/name).
	Service string `json:"service,omitempty"`
	// Selector selects the nginx entry pods when Service is empty.
	Selector string `json:"selector,omitempty"`
}

// Peer is one tier of the route.
type Peer struct {
	// Use is cart, backend or backend-svc.
	Use string `json:"use"`
	// Priority: higher wins (defaults cart 3, backend 2, backend-svc 1).
	Priority int32 `json:"priority"`
	// MaxConcurrency is the per-peer limit; 0 = values.default_max.
	MaxConcurrency int32 `json:"maxConcurrency,omitempty"`
	// MaxConcurrencyFromBackend (cart only): backend limit × backends.
	MaxConcurrencyFromBackend bool `json:"maxConcurrencyFromBackend,omitempty"`
	// ProbePath overrides the health-probe path.
	ProbePath string `json:"probePath,omitempty"`
}

// Monitor writes the model's lines into the monitoring ConfigMap.
type Monitor struct {
	// OutputConfigMap is name or ns/name of the monitoring ConfigMap.
	OutputConfigMap string `json:"outputConfigMap"`
	// Model is the served model name (default metadata.name).
	Model string `json:"model,omitempty"`
	// GPUType overrides the type derived from the nodes' GPU label.
	GPUType string `json:"gpuType,omitempty"`
	// Nginx writes nginx: lines; nil = when the entry is discoverable.
	Nginx *bool `json:"nginx,omitempty"`
	// Router writes router: lines; nil = when spec.cart is set.
	Router *bool `json:"router,omitempty"`
}

// SLO holds LLM service targets. Each maps to one register_route option,
// documented in docs/lua-contract.md.
type SLO struct {
	// TTFTMs is the target time to first token → engine option ttft_limit_ms.
	TTFTMs int32 `json:"ttftMs,omitempty"`
	// DecodeTokensPerSecond is the minimum decode rate → engine option tps_limit_tps.
	DecodeTokensPerSecond int32 `json:"decodeTokensPerSecond,omitempty"`
}

// SplitRef resolves a reference "ns/name" or "name" against namespace (the
// ModelRoute's): a bare name lives in the route's namespace, and a route
// without a namespace (a file given to the CLI) is in "default", as kubectl
// does. Every reference in a spec (Services, output ConfigMaps) resolves
// here.
func SplitRef(ref, namespace string) (ns, name string) {
	if i := strings.IndexByte(ref, '/'); i >= 0 {
		return ref[:i], ref[i+1:]
	}
	if namespace == "" {
		namespace = "default"
	}
	return namespace, ref
}

// SameBackends reports whether a canary's discovery finds the stable
// version's backends, so that a split between them would change nothing:
// the same Service (bare names resolved in namespace, the route's) or the
// same selector text, unless both give a port and the ports differ (two
// versions served from the same pods on two ports). With namespace ""
// (a route file without one) a bare name equals only the same bare name:
// where it lands depends on where the route is applied. The schema
// compares the text only (the API server's rules cannot see the
// namespace); `autoconfig vet` and `autoconfig compile` check this, and
// the controller, which knows every route's namespace, should too.
func SameBackends(stable, canary Discovery, namespace string) bool {
	if stable.Port != 0 && canary.Port != 0 && stable.Port != canary.Port {
		return false
	}
	switch {
	case stable.Service != "" && canary.Service != "":
		if stable.Service == canary.Service {
			return true
		}
		if namespace == "" && (!strings.Contains(stable.Service, "/") || !strings.Contains(canary.Service, "/")) {
			return false
		}
		return RefKey(stable.Service, namespace) == RefKey(canary.Service, namespace)
	case stable.Selector != "" && canary.Selector != "":
		return stable.Selector == canary.Selector
	}
	return false
}

// RefKey resolves ref like SplitRef and returns "ns/name".
func RefKey(ref, namespace string) string {
	ns, name := SplitRef(ref, namespace)
	return ns + "/" + name
}
