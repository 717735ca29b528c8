package compiler

import (
	"fmt"
	"strconv"
	"strings"
)

// The nginx writers both renderers share (renderLLM, renderVideo): the
// file's header, the per-route server's head and prefix strip, the
// engine's shared dict and balancer upstream, the static registration with
// its tiers and options, and the route's nginx names.

// appendHeader writes the file's first comment lines. They name the route
// object but carry no version or time: an upgrade or a no-op reconcile must
// render byte-identical files.
func (c *compilation) appendHeader(b []byte) []byte {
	return append(c.appendHeaderLine(b, RouteKey(c.route)), '\n')
}

// appendHeaderLine writes the one-line header of the output key.
func (c *compilation) appendHeaderLine(b []byte, key string) []byte {
	b = append(b, "# "...)
	b = append(b, key...)
	b = append(b, ": written by autoconfig from ModelRoute "...)
	if c.route.Namespace != "" {
		b = append(b, c.route.Namespace...)
		b = append(b, '/')
	}
	b = append(b, c.route.Name...)
	return append(b, "; do not edit.\n"...)
}

// appendServerHead opens the per-route server: it listens only on its unix
// socket (the reload sidecar parses this line) and restores the client
// address the dispatch server passed as X-Real-IP.
func (c *compilation) appendServerHead(b []byte) []byte {
	b = append(b, "server {\n    listen unix:"...)
	b = append(b, c.opts.SockDir...)
	b = append(b, '/')
	b = append(b, c.name...)
	b = append(b, ".sock;\n    set_real_ip_from unix:;\n    real_ip_header X-Real-IP;\n\n"...)
	return b
}

// appendStrip strips the /<route> prefix so backends (and path options)
// see /v2/…; "(?s)" lets the capture cross a decoded %0A.
func (c *compilation) appendStrip(b []byte) []byte {
	b = append(b, "        rewrite \"(?s)^/"...)
	b = appendRouteRE(b, c.name)
	b = append(b, "(/.*)$\" $1 break;\n"...)
	return b
}

// appendRouteRE writes the route name as a regex matching it literally
// (route names are [a-z0-9._-]: only '.' needs escaping).
func appendRouteRE(b []byte, name string) []byte {
	for i := 0; i < len(name); i++ {
		if name[i] == '.' {
			b = append(b, '\\')
		}
		b = append(b, name[i])
	}
	return b
}

// appendSharedDict declares the engine's per-route lua shared dict. Route
// files are included inside http{}: the dict is declared here, one per
// route, named as the route.
func appendSharedDict(b []byte, route, size string) []byte {
	b = append(b, "# The engine's per-route lua shared dict, named as the route.\nlua_shared_dict "...)
	b = append(b, route...)
	b = append(b, ' ')
	b = append(b, size...)
	return append(b, ";\n\n"...)
}

// DefaultSharedDictSize is the size of a route's lua shared dict unless
// spec.nginx.values.shared_dict_size sets it.
const DefaultSharedDictSize = "10m"

// SharedDictSizeKey is the spec.nginx.values key that sizes the route's lua
// shared dict.
const SharedDictSizeKey = "shared_dict_size"

// sharedDictSize is the route's lua_shared_dict size: values.shared_dict_size
// in nginx size form (digits, optional k or m: nginx refuses g there), from 64k (nginx -t fails
// below 12k: "ngx_slab_alloc() failed: no memory"; 64k leaves the engine
// room for its per-peer state) to
// 16g, or DefaultSharedDictSize. The value is written into an nginx
// directive unquoted, so only that form passes.
func (c *compilation) sharedDictSize() (string, error) {
	v, ok := c.route.Spec.Nginx.Values[SharedDictSizeKey]
	if !ok {
		return DefaultSharedDictSize, nil
	}
	bad := fmt.Errorf("spec.nginx.values.%s %q must be an nginx size from 64k to 16384m, such as 10m, 512k or 1024m (nginx takes no g unit in lua_shared_dict)", SharedDictSizeKey, v)
	num, mult := v, int64(1)
	if n := len(v); n > 0 {
		switch v[n-1] {
		case 'k', 'K':
			num, mult = v[:n-1], 1<<10
		case 'm', 'M':
			num, mult = v[:n-1], 1<<20
		}
	}
	if num == "" || len(num) > 11 || num[0] == '0' {
		return "", bad
	}
	for i := 0; i < len(num); i++ {
		if num[i] < '0' || num[i] > '9' {
			return "", bad
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n > (16<<30)/mult || n*mult < 64<<10 {
		return "", bad
	}
	return v, nil
}

// appendBalancerUpstream writes the route's upstream whose every peer the
// engine's balancer picks.
func appendBalancerUpstream(b []byte, route string) []byte {
	b = append(b, "# Every peer is chosen by the engine's balancer; the server below is a\n# placeholder nginx requires and is never contacted.\nupstream "...)
	b = append(b, upstreamName(route)...)
	b = append(b, " {\n    server 0.0.0.1:1;\n    balancer_by_lua_block {\n        require(\""+LuaModule+"\").balance("...)
	b = appendLuaString(b, route)
	return append(b, ")\n    }\n}\n\n"...)
}

// appendStaticRegistration writes the access-phase lua that registers an
// llm route with its options and its tiers, then admits the request
// (inside access_by_lua_block, after the tuning guard).
func (c *compilation) appendStaticRegistration(b []byte, opts [][2]string, tiers []tier) []byte {
	return appendRegistration(b, c.name, "register_route", opts, func(b []byte) []byte {
		b = append(b, "                }, {\n"...)
		for _, t := range tiers {
			b = appendLuaTier(b, t, "                    ")
		}
		if c.hasCanary() {
			b = c.appendCanaryArg(b, c.canaryTier(!c.video))
		}
		return b
	})
}

// appendRegistration writes the access-phase lua that registers the route
// name once per worker, with the engine's function fn (register_route,
// register_dynamic_route), the options opts in the order given and then
// what more writes (nil: nothing), and admits the request.
func appendRegistration(b []byte, name, fn string, opts [][2]string, more func([]byte) []byte) []byte {
	route := LuaString(name)
	b = append(b, "            local router = require(\""+LuaModule+"\")\n            if not router.registered("...)
	b = append(b, route...)
	b = append(b, ") then\n                router."...)
	b = append(b, fn...)
	b = append(b, '(')
	b = append(b, route...)
	b = append(b, ", {\n"...)
	b = appendLuaOptions(b, opts)
	if more != nil {
		b = more(b)
	}
	b = append(b, "                })\n            end\n            router.access("...)
	b = append(b, route...)
	return append(b, ")\n"...)
}

// appendLuaTier writes one tier of a registration, its "{" at indent.
func appendLuaTier(b []byte, t tier, indent string) []byte {
	b = append(b, indent...)
	b = append(b, "{\n"...)
	b = append(b, indent...)
	b = append(b, "    [ \"use\" ] = "...)
	b = appendLuaString(b, t.use)
	b = append(b, ",\n"...)
	b = append(b, indent...)
	b = append(b, "    [ \"priority\" ] = "...)
	b = strconv.AppendInt(b, int64(t.priority), 10)
	b = append(b, ",\n"...)
	if t.maxConc > 0 {
		b = append(b, indent...)
		b = append(b, "    [ \"max_concurrency\" ] = "...)
		b = strconv.AppendInt(b, t.maxConc, 10)
		b = append(b, ",\n"...)
	}
	if t.probe != "" {
		b = append(b, indent...)
		b = append(b, "    [ \"probe_path\" ] = "...)
		b = appendLuaString(b, t.probe)
		b = append(b, ",\n"...)
	}
	b = append(b, indent...)
	b = append(b, "    [ \"peers\" ] = {\n"...)
	for i := range t.peers {
		p := &t.peers[i]
		b = append(b, indent...)
		b = append(b, "        { [ \"host\" ] = "...)
		b = appendLuaString(b, p.ip)
		b = append(b, ", [ \"port\" ] = "...)
		b = strconv.AppendInt(b, int64(p.port), 10)
		b = append(b, " },\n"...)
	}
	b = append(b, indent...)
	b = append(b, "    },\n"...)
	b = append(b, indent...)
	return append(b, "},\n"...)
}

// appendLuaOptions writes the lines of a registration's options table,
// one "[ key ] = value," per option, in the order given.
func appendLuaOptions(b []byte, opts [][2]string) []byte {
	for _, kv := range opts {
		b = append(b, "                    [ "...)
		b = appendLuaString(b, kv[0])
		b = append(b, " ] = "...)
		b = appendLuaString(b, kv[1])
		b = append(b, ",\n"...)
	}
	return b
}

// upstreamName is the nginx upstream of a route: autoconfig_<ident>.
func upstreamName(route string) string { return "autoconfig_" + ident(route) }

// ident turns a route name ([a-z0-9._-]) into a unique nginx identifier
// ([a-z0-9_]): '_' → "__", '.' → "_d", '-' → "_h". Distinct routes get
// distinct identifiers, so zones and variables of routes sharing one http{}
// never collide.
func ident(route string) string {
	var sb strings.Builder
	sb.Grow(len(route) + 8)
	for i := 0; i < len(route); i++ {
		switch c := route[i]; c {
		case '_':
			sb.WriteString("__")
		case '.':
			sb.WriteString("_d")
		case '-':
			sb.WriteString("_h")
		default:
			sb.WriteByte(c)
		}
	}
	return sb.String()
}
