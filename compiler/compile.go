package compiler

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/modelsphere/autoconfig/internal/endpoints"
	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// DefaultSockDir is where the openresty image's dispatch server expects the
// per-route unix sockets.
const DefaultSockDir = "/usr/local/openresty/nginx/sock"

// LuaModule is the lua module of the openresty image's routing engine that
// llm route files call (docs/lua-contract.md).
const LuaModule = "router"

// ErrNoBackends is returned (wrapped) when the snapshot has no backend
// endpoints. An empty discovery result must never be written: CART refuses
// an empty workers list and openresty would drop all traffic, so the caller
// keeps the last good output and says so in status.
var ErrNoBackends = errors.New("no backend endpoints discovered")

// ErrNoPeers is returned (wrapped) when none of the route's peer tiers can
// be rendered (e.g. only a backend-svc tier and the backend has no VIP).
var ErrNoPeers = errors.New("no peer tier can be rendered")

// Options tune rendering. The zero value renders for the production image.
type Options struct {
	// SockDir is the absolute directory of the per-route unix sockets
	// (default DefaultSockDir).
	SockDir string
	// DynamicPeers: the consumer declared peers.Annotation ("true") on its
	// routes ConfigMap, so its engine takes peers without a reload. The
	// route file then registers the route with
	// router.register_dynamic_route and holds no peer (it depends on the
	// spec alone), and the peers travel in a second key of the same
	// ConfigMap, peers.Key(route). False renders every output exactly as
	// before the option existed.
	DynamicPeers bool
}

func (o Options) withDefaults() (Options, error) {
	if o.SockDir == "" {
		o.SockDir = DefaultSockDir
	}
	o.SockDir = strings.TrimRight(o.SockDir, "/")
	if !strings.HasPrefix(o.SockDir, "/") {
		return o, fmt.Errorf("sock dir %q must be an absolute path", o.SockDir)
	}
	// The directory is written into an nginx listen line unquoted: allow
	// only characters that cannot end or extend the directive.
	for i := 0; i < len(o.SockDir); i++ {
		if c := o.SockDir[i]; !(c == '/' || c == '.' || c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return o, fmt.Errorf("sock dir %q may contain only letters, digits, '/', '.', '_' and '-'", o.SockDir)
		}
	}
	return o, nil
}

// Route is what the compiler reads of a ModelRoute: its name, its
// namespace and its spec, validated and defaulted by the schema
// (schema.Validator). The compiler takes no Kubernetes object, so it
// depends on neither apimachinery nor CUE: a caller holding a
// v1alpha1.ModelRoute passes its name, namespace and spec.
type Route struct {
	Name      string
	Namespace string
	Spec      routespec.Spec
}

// RouteName is the route's short name: spec.nginx.route, or metadata.name
// when the route was not defaulted.
func RouteName(route *Route) string {
	if route.Spec.Nginx.Route != "" {
		return route.Spec.Nginx.Route
	}
	return route.Name
}

// RouteKey is the key of the route's file in the openresty ConfigMap:
// session_route_<route>.conf.
func RouteKey(route *Route) string {
	return "session_route_" + RouteName(route) + ".conf"
}

// PeersKey is the key of the route's peers table in the openresty
// ConfigMap under Options.DynamicPeers: peers.Key of the route name,
// peers_<route>.json (not a *.conf key: nginx does not include it).
func PeersKey(route *Route) string {
	return peers.Key(RouteName(route))
}

// CartKey is the key of the CART config in the CART ConfigMap.
const CartKey = "config.yaml"

// MonitorKey is the key of a model's file in the monitoring ConfigMap:
// <model>.monitor.conf with every '/' as '_' (Qwen/Qwen2.5-72B-Instruct →
// Qwen_Qwen2.5-72B-Instruct.monitor.conf).
func MonitorKey(model string) string {
	return strings.ReplaceAll(model, "/", "_") + ".monitor.conf"
}

// MonitorModel is the served model name of spec.monitor: monitor.model,
// or metadata.name when it is not set.
func MonitorModel(route *Route) string {
	if m := route.Spec.Monitor; m != nil && m.Model != "" {
		return m.Model
	}
	return route.Name
}

// ResolveRef resolves a name or ns/name reference against the route's
// namespace (routespec.RefKey).
func ResolveRef(route *Route, ref string) string {
	return routespec.RefKey(ref, route.Namespace)
}

// KnownConfigMap resolves a ConfigMap reference of the route as
// ResolveRef does, when the result does not depend on where the route is
// applied: a ns/name reference, or a bare name of a route that names its
// namespace. ok is false for a bare name of a route without a namespace (a
// file not applied yet lands in whichever namespace it is applied to).
func KnownConfigMap(route *Route, ref string) (cm string, ok bool) {
	if ref == "" || (route.Namespace == "" && !strings.Contains(ref, "/")) {
		return "", false
	}
	return ResolveRef(route, ref), true
}

// OwnedKey is one ConfigMap key a route writes.
type OwnedKey struct {
	// ConfigMap is "namespace/name".
	ConfigMap string
	// Key is the data key.
	Key string
	// Field is the spec field that names the key (where to change it).
	Field string
}

// OutputKeys are every key the route writes without dynamic peers
// (OutputKeysFor(route, false)), in Compile's output order: the route file,
// the CART config.yaml (spec.cart), the monitor file (spec.monitor). They
// come from the spec alone (no validation, no endpoints), so two routes
// that would write one key can be found before anything is written.
func OutputKeys(route *Route) []OwnedKey {
	return OutputKeysFor(route, false)
}

// OutputKeysFor are every key the route writes when rendered with
// Options.DynamicPeers = dynamic, in Compile's output order: the route
// file, with dynamic the peers table (PeersKey) in the same ConfigMap,
// the CART config.yaml, the monitor file. From the spec alone, as
// OutputKeys.
func OutputKeysFor(route *Route, dynamic bool) []OwnedKey {
	var out []OwnedKey
	if cm := route.Spec.Nginx.OutputConfigMap; cm != "" {
		out = append(out, OwnedKey{ResolveRef(route, cm), RouteKey(route), "spec.nginx.route"})
		if dynamic {
			out = append(out, OwnedKey{ResolveRef(route, cm), PeersKey(route), "spec.nginx.route"})
		}
	}
	if c := route.Spec.Cart; c != nil && c.OutputConfigMap != "" {
		out = append(out, OwnedKey{ResolveRef(route, c.OutputConfigMap), CartKey, "spec.cart.outputConfigMap"})
	}
	if m := route.Spec.Monitor; m != nil && m.OutputConfigMap != "" {
		out = append(out, OwnedKey{ResolveRef(route, m.OutputConfigMap), MonitorKey(MonitorModel(route)), "spec.monitor.model"})
	}
	return out
}

// Keys is what a route's keys are, from the spec alone: how its marks
// name it, every key it writes with the spec field that names it, the
// ConfigMap of its route file and its monitor key. Compile returns it in
// Result.Keys, so a caller that writes the outputs and guards the keys
// (the controller's key guard) needs nothing more from the compiler about
// the route it compiled.
type Keys struct {
	// Owner is how the route's marks name it (OwnerRef).
	Owner string
	// Outputs are OutputKeysFor(route, dynamic), in Compile's output order.
	Outputs []OwnedKey
	// NginxConfigMap is the route file's ConfigMap (namespace/name; ""
	// when spec.nginx.outputConfigMap is empty).
	NginxConfigMap string
	// Monitor is the monitor file's key (zero without spec.monitor or its
	// outputConfigMap).
	Monitor OwnedKey
}

// KeysFor is Keys of route rendered with Options.DynamicPeers = dynamic
// (from the spec alone, as OutputKeysFor: no validation, no endpoints).
func KeysFor(route *Route, dynamic bool) Keys {
	k := Keys{Owner: OwnerRef(route.Namespace, route.Name), Outputs: OutputKeysFor(route, dynamic)}
	if cm := route.Spec.Nginx.OutputConfigMap; cm != "" {
		k.NginxConfigMap = ResolveRef(route, cm)
	}
	if m := route.Spec.Monitor; m != nil && m.OutputConfigMap != "" {
		k.Monitor = OwnedKey{ResolveRef(route, m.OutputConfigMap), MonitorKey(MonitorModel(route)), "spec.monitor.model"}
	}
	return k
}

// OwnedKeys are the keys the route's spec renders alone without dynamic
// peers (OwnedKeysFor(route, false)), the ones removed when the route goes
// away: OutputKeys without the CART config.yaml, which is the whole
// per-model file of the CART chart, rewritten in part, never removed.
// Computed from the spec alone, so even a route whose spec became invalid
// can be cleaned up.
func OwnedKeys(route *Route) []OwnedKey {
	return OwnedKeysFor(route, false)
}

// OwnedKeysFor are OwnedKeys for a render with Options.DynamicPeers =
// dynamic: OutputKeysFor(route, dynamic) without the CART config.yaml.
func OwnedKeysFor(route *Route, dynamic bool) []OwnedKey {
	out := OutputKeysFor(route, dynamic)
	return slices.DeleteFunc(out, func(k OwnedKey) bool { return k.Key == CartKey })
}

// Compile renders every output the route owns from a validated, defaulted
// route (schema.Validator output) and an endpoint snapshot. Outputs come in
// a fixed order: the openresty route file, the peers table (only with
// Options.DynamicPeers), the CART config.yaml (when spec.cart is set), the
// monitor file (when spec.monitor is set).
//
// With Options.DynamicPeers the route file depends on the spec alone: an
// endpoint change changes only the peers table (and the CART and monitor
// files), so the consumer's engine takes it without a reload. The table
// holds exactly the tiers the static route file would hold.
//
// It fails with ErrNoBackends when the snapshot has no backends (unless
// the route has spec.scaleToZero: then it renders a route without tiers
// that holds requests, and Result.ScaledToZero), on
// malformed endpoints (bad IP, port outside 1–65535) and on endpoint lists
// not in normal form (sorted and unique: endpoints.Normalize, which
// discovery applies): nothing is rendered from data that would break a
// consumer or depend on discovery order.
func Compile(route *Route, snap Snapshot, opts Options) (Result, error) {
	var res Result
	if route == nil {
		return res, errors.New("nil route")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return res, err
	}
	name := RouteName(route)
	if !validRouteName(name) {
		return res, fmt.Errorf("route name %q must be 1-63 characters of a-z, 0-9, '.', '_', '-' (validate the route with the schema first)", name)
	}
	c := compilation{route: route, name: name, opts: opts, res: &res}
	if c.backends, err = checkEndpoints(snap.Backends, "backend"); err != nil {
		return res, err
	}
	if len(c.backends) == 0 {
		if route.Spec.ScaleToZero == nil {
			return res, fmt.Errorf("route %s: %w", name, ErrNoBackends)
		}
		// Zero is a state of a scale-to-zero route: no tiers, the
		// engine holds.
		res.ScaledToZero = true
	}
	if c.backendSvc, err = normalizeVIP(snap.BackendService, "backend service"); err != nil {
		return res, err
	}
	if c.cartSvc, err = normalizeVIP(snap.CartService, "cart service"); err != nil {
		return res, err
	}
	if c.cartPods, err = checkEndpoints(snap.CartPods, "cart pod"); err != nil {
		return res, err
	}
	if c.nginxPods, err = checkEndpoints(snap.NginxPods, "nginx pod"); err != nil {
		return res, err
	}

	if err := c.checkCanary(snap); err != nil {
		return Result{}, fmt.Errorf("route %s: %w", name, err)
	}

	llm := route.Spec.ModelType != routespec.ModelTypeVideo
	c.video = !llm
	var tiers []tier
	if !res.ScaledToZero {
		if tiers, err = c.tiers(llm); err != nil {
			return Result{}, fmt.Errorf("route %s: %w", name, err)
		}
	}
	var conf []byte
	if llm {
		conf, err = c.renderLLM(tiers)
	} else {
		conf, err = c.renderVideo(tiers)
	}
	if err != nil {
		return Result{}, fmt.Errorf("route %s: %w", name, err)
	}
	nginxCM := ResolveRef(route, route.Spec.Nginx.OutputConfigMap)
	res.Outputs = append(res.Outputs, Output{
		ConfigMap: nginxCM,
		Key:       RouteKey(route),
		Render:    constant(conf),
	})
	if opts.DynamicPeers {
		table, err := c.peersTable(tiers)
		if err != nil {
			return Result{}, fmt.Errorf("route %s: peers table: %w", name, err)
		}
		res.Outputs = append(res.Outputs, Output{
			ConfigMap: nginxCM,
			Key:       PeersKey(route),
			Render:    constant(table),
		})
	}
	if cart := route.Spec.Cart; cart != nil {
		cm := ResolveRef(route, cart.OutputConfigMap)
		res.Outputs = append(res.Outputs, Output{
			ConfigMap: cm,
			Key:       CartKey,
			Render: func(current []byte) ([]byte, error) {
				return RenderCartConfig(current, c.cartWorkers(), cm, OwnerRef(route.Namespace, route.Name))
			},
		})
	}
	res.Keys = KeysFor(route, opts.DynamicPeers)
	if mon := route.Spec.Monitor; mon != nil {
		model := MonitorModel(route)
		res.Outputs = append(res.Outputs, Output{
			ConfigMap: ResolveRef(route, mon.OutputConfigMap),
			Key:       MonitorKey(model),
			Render:    constant(c.renderMonitor(model)),
		})
	}
	return res, nil
}

// constant is a Render that ignores the current content. The returned slice
// is shared: callers must not modify it.
func constant(b []byte) func([]byte) ([]byte, error) {
	return func([]byte) ([]byte, error) { return b, nil }
}

// compilation carries one Compile call's checked inputs.
type compilation struct {
	route      *Route
	name       string
	opts       Options
	res        *Result
	backends   []endpoint
	backendSvc *endpoint
	cartSvc    *endpoint
	cartPods   []endpoint
	nginxPods  []endpoint
	// canary are the canary backends (spec.canary only).
	canary []endpoint
	// video: a video route (else llm).
	video bool
}

func (c *compilation) warnf(format string, args ...any) {
	c.res.Warnings = append(c.res.Warnings, fmt.Sprintf(format, args...))
}

// endpoint is a parsed, canonical Endpoint. It holds no netip.Addr (24
// bytes with a pointer): the render path only needs the text and the family.
type endpoint struct {
	ip   string // canonical text form, IPv6 without brackets
	gpu  string // nvidia.com/gpu.product label
	port int32
	v6   bool
}

// appendHostPort writes ip:port, IPv6 as [ip]:port.
func (e *endpoint) appendHostPort(b []byte) []byte {
	if e.v6 {
		b = append(b, '[')
		b = append(b, e.ip...)
		b = append(b, ']')
	} else {
		b = append(b, e.ip...)
	}
	b = append(b, ':')
	return strconv.AppendInt(b, int64(e.port), 10)
}

// parseAddr checks one endpoint and returns its address (IPv4-mapped IPv6
// unmapped) and whether ip is already the address's canonical text.
func parseAddr(ip string, port int32, what string) (a netip.Addr, canonical bool, err error) {
	a, err = netip.ParseAddr(ip)
	if err != nil {
		return a, false, fmt.Errorf("%s endpoint: bad IP %q: %w", what, ip, err)
	}
	if a.Zone() != "" {
		return a, false, fmt.Errorf("%s endpoint: IP %q has a zone; only global addresses can be rendered", what, ip)
	}
	if port < 1 || port > 65535 {
		return a, false, fmt.Errorf("%s endpoint %s: port %d is outside 1-65535", what, ip, port)
	}
	// ParseAddr accepts only the canonical dotted form for IPv4 (no
	// leading zeros), so an IPv4 input string is reused: no allocation.
	if a.Is4() {
		return a, true, nil
	}
	return a.Unmap(), false, nil
}

func parseEndpoint(ip string, port int32, what string) (endpoint, error) {
	a, canonical, err := parseAddr(ip, port, what)
	if err != nil {
		return endpoint{}, err
	}
	if !canonical {
		ip = a.String()
	}
	return endpoint{ip: ip, port: port, v6: a.Is6()}, nil
}

// checkEndpoints parses and validates every endpoint (bad IP, zone, port
// range) and checks the list is in normal form: sorted and unique, as
// endpoints.Normalize leaves it (discovery applies it). The compiler does not
// sort again, so it renders in the order given and refuses another order.
// A bad endpoint is reported before an order violation.
func checkEndpoints(in []Endpoint, what string) ([]endpoint, error) {
	out := make([]endpoint, 0, len(in))
	var orderErr error
	var prev netip.Addr
	for i := range in {
		a, canonical, err := parseAddr(in[i].IP, in[i].Port, what)
		if err != nil {
			return nil, err
		}
		if i > 0 && orderErr == nil {
			if c := endpoints.Compare(prev, in[i-1].Port, a, in[i].Port); c >= 0 {
				problem := "is out of order after"
				if c == 0 {
					problem = "duplicates"
				}
				orderErr = fmt.Errorf("%s endpoints are not sorted and unique: #%d (%s port %d) %s #%d (%s port %d); normalise the list with discovery first",
					what, i, in[i].IP, in[i].Port, problem, i-1, in[i-1].IP, in[i-1].Port)
			}
		}
		prev = a
		ip := in[i].IP
		if !canonical {
			ip = a.String()
		}
		out = append(out, endpoint{ip: ip, gpu: in[i].GPUProduct, port: in[i].Port, v6: a.Is6()})
	}
	if orderErr != nil {
		return nil, orderErr
	}
	return out, nil
}

func normalizeVIP(v *ServiceVIP, what string) (*endpoint, error) {
	if v == nil || v.IP == "" || v.IP == "None" {
		return nil, nil
	}
	e, err := parseEndpoint(v.IP, v.Port, what)
	if err != nil {
		return nil, err
	}
	return &e, nil
}

// validRouteName repeats the schema's rule: the name is written unquoted
// into the listen line, the socket name and the conf file name.
func validRouteName(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
