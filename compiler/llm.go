package compiler

import (
	"slices"
	"strconv"
	"strings"
)

// renderLLM writes the llm route file: a balancer upstream and a per-route
// server whose access phase registers the route with the lua engine once per
// worker. The exact contract is docs/lua-contract.md.
func (c *compilation) renderLLM() ([]byte, error) {
	tiers, err := c.tiers(true)
	if err != nil {
		return nil, err
	}
	n := 0
	for _, t := range tiers {
		n += len(t.peers)
	}
	b := make([]byte, 0, 2560+96*n+128*len(c.route.Spec.Nginx.Values))
	b = c.appendHeader(b)
	up := upstreamName(c.name)
	route := LuaString(c.name)

	b = append(b, "# Every peer is chosen by the engine's balancer; the server below is a\n# placeholder nginx requires and is never contacted.\nupstream "...)
	b = append(b, up...)
	b = append(b, " {\n    server 0.0.0.1:1;\n    balancer_by_lua_block {\n        require(\""+LuaModule+"\").balance("...)
	b = append(b, route...)
	b = append(b, ")\n    }\n}\n\n"...)

	b = c.appendServerHead(b)
	b = append(b, "    location / {\n"...)
	b = c.appendStrip(b)
	b = append(b, "        access_by_lua_block {\n            local router = require(\""+LuaModule+"\")\n            if not router.registered("...)
	b = append(b, route...)
	b = append(b, ") then\n                router.register_route("...)
	b = append(b, route...)
	b = append(b, ", {\n"...)
	for _, kv := range c.llmOptions() {
		b = append(b, "                    [ "...)
		b = appendLuaString(b, kv[0])
		b = append(b, " ] = "...)
		b = appendLuaString(b, kv[1])
		b = append(b, ",\n"...)
	}
	b = append(b, "                }, {\n"...)
	for _, t := range tiers {
		b = append(b, "                    {\n                        [ \"use\" ] = "...)
		b = appendLuaString(b, t.use)
		b = append(b, ",\n                        [ \"priority\" ] = "...)
		b = strconv.AppendInt(b, int64(t.priority), 10)
		b = append(b, ",\n"...)
		if t.maxConc > 0 {
			b = append(b, "                        [ \"max_concurrency\" ] = "...)
			b = strconv.AppendInt(b, t.maxConc, 10)
			b = append(b, ",\n"...)
		}
		if t.probe != "" {
			b = append(b, "                        [ \"probe_path\" ] = "...)
			b = appendLuaString(b, t.probe)
			b = append(b, ",\n"...)
		}
		b = append(b, "                        [ \"peers\" ] = {\n"...)
		for i := range t.peers {
			p := &t.peers[i]
			b = append(b, "                            { [ \"host\" ] = "...)
			b = appendLuaString(b, p.ip)
			b = append(b, ", [ \"port\" ] = "...)
			b = strconv.AppendInt(b, int64(p.port), 10)
			b = append(b, " },\n"...)
		}
		b = append(b, "                        },\n                    },\n"...)
	}
	b = append(b, "                })\n            end\n            router.access("...)
	b = append(b, route...)
	b = append(b, ")\n        }\n"...)
	b = append(b, "        proxy_pass http://"...)
	b = append(b, up...)
	b = append(b, `;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_set_header X-Real-IP $remote_addr;
        # Token streams go out as they come; a long prompt may think for
        # minutes before the first byte.
        proxy_buffering off;
        proxy_read_timeout 3600s;
        proxy_send_timeout 3600s;
`...)
	if c.failOpen() {
		// nginx's default is 60s: a blackholed peer would hold a request
		// that long before the engine's retry moves on.
		b = append(b, "        proxy_connect_timeout "+failOpenConnectTimeout+";\n"...)
	}
	b = append(b, `        log_by_lua_block {
            require("`+LuaModule+`").log(`...)
	b = append(b, route...)
	b = append(b, ")\n        }\n    }\n}\n"...)
	return b, nil
}

// llmOptions are the register_route options: spec.nginx.values verbatim
// plus the slo fields as the engine's own options (ttftMs → ttft_limit_ms,
// decodeTokensPerSecond → tps_limit_tps; the schema rejects a route giving
// either also as a value), sorted by key.
func (c *compilation) llmOptions() [][2]string {
	spec := c.route.Spec
	out := make([][2]string, 0, len(spec.Nginx.Values)+2)
	for k, v := range spec.Nginx.Values {
		out = append(out, [2]string{k, v})
	}
	if s := spec.SLO; s != nil {
		if s.TTFTMs > 0 {
			out = append(out, [2]string{"ttft_limit_ms", strconv.Itoa(int(s.TTFTMs))})
		}
		if s.DecodeTokensPerSecond > 0 {
			out = append(out, [2]string{"tps_limit_tps", strconv.Itoa(int(s.DecodeTokensPerSecond))})
		}
	}
	out = c.failureModeOptions(out)
	slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	return out
}

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
	for i := 0; i < len(c.name); i++ {
		if c.name[i] == '.' {
			b = append(b, '\\')
		}
		b = append(b, c.name[i])
	}
	b = append(b, "(/.*)$\" $1 break;\n"...)
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
