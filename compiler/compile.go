package compiler

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

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

// OwnedKey is one ConfigMap key a route writes.
type OwnedKey struct {
	// ConfigMap is "namespace/name".
	ConfigMap string
	// Key is the data key.
	Key string
}

// OwnedKeys are the keys the route's spec renders alone, computed from the
// spec without validation or endpoints, so even a route whose spec became
// invalid can be cleaned up: the route file and the monitor file. The
// CART config.yaml is not included: it is the whole per-model file of the
// CART chart, rewritten in part, never removed. Compile's outputs use the
// same names.
func OwnedKeys(route *Route) []OwnedKey {
	var out []OwnedKey
	if cm := route.Spec.Nginx.OutputConfigMap; cm != "" {
		out = append(out, OwnedKey{ResolveRef(route, cm), RouteKey(route)})
	}
	if m := route.Spec.Monitor; m != nil && m.OutputConfigMap != "" {
		out = append(out, OwnedKey{ResolveRef(route, m.OutputConfigMap), MonitorKey(MonitorModel(route))})
	}
	return out
}

// Compile renders every output the route owns from a validated, defaulted
// route (schema.Validator output) and an endpoint snapshot. Outputs come in
// a fixed order: the openresty route file, the CART config.yaml (when
// spec.cart is set), the monitor file (when spec.monitor is set).
//
// It fails with ErrNoBackends when the snapshot has no backends, and on
// malformed endpoints (bad IP, port outside 1–65535): nothing is rendered
// from data that would break a consumer.
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
	if c.backends, err = normalize(snap.Backends, "backend"); err != nil {
		return res, err
	}
	if len(c.backends) == 0 {
		return res, fmt.Errorf("route %s: %w", name, ErrNoBackends)
	}
	if c.backendSvc, err = normalizeVIP(snap.BackendService, "backend service"); err != nil {
		return res, err
	}
	if c.cartSvc, err = normalizeVIP(snap.CartService, "cart service"); err != nil {
		return res, err
	}
	if c.cartPods, err = normalize(snap.CartPods, "cart pod"); err != nil {
		return res, err
	}
	if c.nginxPods, err = normalize(snap.NginxPods, "nginx pod"); err != nil {
		return res, err
	}

	var conf []byte
	if route.Spec.ModelType == routespec.ModelTypeVideo {
		conf, err = c.renderVideo()
	} else {
		conf, err = c.renderLLM()
	}
	if err != nil {
		return Result{}, fmt.Errorf("route %s: %w", name, err)
	}
	res.Outputs = append(res.Outputs, Output{
		ConfigMap: ResolveRef(route, route.Spec.Nginx.OutputConfigMap),
		Key:       RouteKey(route),
		Render:    constant(conf),
	})
	if cart := route.Spec.Cart; cart != nil {
		cm := ResolveRef(route, cart.OutputConfigMap)
		res.Outputs = append(res.Outputs, Output{
			ConfigMap: cm,
			Key:       CartKey,
			Render: func(current []byte) ([]byte, error) {
				return RenderCartConfig(current, c.cartWorkers(), cm)
			},
		})
	}
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

// compilation carries one Compile call's normalized inputs.
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

// normalize parses, sorts (by address, then port) and deduplicates
// endpoints, so the output does not depend on discovery order. Sorting runs
// on pointer-free keys (no write barriers, no netip.Compare calls) and the
// result is built once, in order, straight from the input: at 10,000
// endpoints this is most of Compile's time.
func normalize(in []Endpoint, what string) ([]endpoint, error) {
	// IPv4 endpoints (the common case) sort as packed uint64s (address,
	// port, index), with no comparison closure; the rest (IPv6, or more
	// endpoints than the index field holds) go through the general
	// comparison. IPv4 comes first, as netip.Addr.Compare orders them.
	pack := len(in) <= 1<<16
	var v4 []uint64
	var keys []sortKey
	var text map[int]string // canonical text of inputs not written canonically (rare)
	if pack {
		v4 = make([]uint64, 0, len(in))
	}
	for i := range in {
		a, canonical, err := parseAddr(in[i].IP, in[i].Port, what)
		if err != nil {
			return nil, err
		}
		if !canonical && a.Is4() {
			if text == nil {
				text = map[int]string{}
			}
			text[i] = a.String()
		}
		if pack && a.Is4() {
			a4 := a.As4()
			v4 = append(v4, uint64(binary.BigEndian.Uint32(a4[:]))<<32|uint64(uint16(in[i].Port))<<16|uint64(i))
			continue
		}
		a16 := a.As16()
		keys = append(keys, sortKey{
			hi:   binary.BigEndian.Uint64(a16[:8]),
			lo:   binary.BigEndian.Uint64(a16[8:]),
			v6:   a.Is6(),
			port: uint16(in[i].Port),
			idx:  uint32(i),
		})
	}
	at := func(i int, v6 bool, hi, lo uint64) endpoint {
		e := endpoint{ip: in[i].IP, gpu: in[i].GPUProduct, port: in[i].Port, v6: v6}
		switch {
		case v6:
			var a16 [16]byte
			binary.BigEndian.PutUint64(a16[:8], hi)
			binary.BigEndian.PutUint64(a16[8:], lo)
			e.ip = netip.AddrFrom16(a16).String()
		case text != nil:
			if t, ok := text[i]; ok {
				e.ip = t
			}
		}
		return e
	}
	out := make([]endpoint, 0, len(in))
	slices.Sort(v4)
	for i := 0; i < len(v4); {
		// A run of the same address and port is one endpoint; the smallest
		// GPU label wins, whatever the input order.
		best := int(v4[i] & 0xffff)
		j := i + 1
		for ; j < len(v4) && v4[j]>>16 == v4[i]>>16; j++ {
			if k := int(v4[j] & 0xffff); in[k].GPUProduct < in[best].GPUProduct {
				best = k
			}
		}
		out = append(out, at(best, false, 0, 0))
		i = j
	}
	slices.SortFunc(keys, func(a, b sortKey) int {
		// IPv4 before IPv6, as netip.Addr.Compare orders them.
		if a.v6 != b.v6 {
			if a.v6 {
				return 1
			}
			return -1
		}
		if c := cmp.Compare(a.hi, b.hi); c != 0 {
			return c
		}
		if c := cmp.Compare(a.lo, b.lo); c != 0 {
			return c
		}
		if c := cmp.Compare(a.port, b.port); c != 0 {
			return c
		}
		// Duplicates: the smallest GPU label wins, whatever the order.
		return strings.Compare(in[a.idx].GPUProduct, in[b.idx].GPUProduct)
	})
	for i, k := range keys {
		if i > 0 && k.hi == keys[i-1].hi && k.lo == keys[i-1].lo && k.v6 == keys[i-1].v6 && k.port == keys[i-1].port {
			continue
		}
		out = append(out, at(int(k.idx), k.v6, k.hi, k.lo))
	}
	return out, nil
}

// sortKey orders endpoints outside the packed IPv4 path: family, address
// bytes, port.
type sortKey struct {
	hi, lo uint64
	v6     bool
	port   uint16
	idx    uint32
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
