package compiler

import (
	"slices"
	"strconv"
	"strings"
)

// renderLLM writes the llm route file from the route's tiers (c.tiers(true)):
// a balancer upstream and a per-route server whose access phase registers
// the route with the lua engine once per worker. The exact contract is
// docs/lua-contract.md. With Options.DynamicPeers the registration holds no
// tiers (register_dynamic_route: the peers table carries them).
func (c *compilation) renderLLM(tiers []tier) ([]byte, error) {
	n := 0
	for _, t := range tiers {
		n += len(t.peers)
	}
	dict, err := c.sharedDictSize()
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, 4096+96*n+128*len(c.route.Spec.Nginx.Values))
	b = c.appendHeader(b)
	b = appendSharedDict(b, c.name, dict)
	b = appendBalancerUpstream(b, c.name)
	b = c.appendServerHead(b)
	b = append(b, "    location / {\n"...)
	b = c.appendLLMLocation(b, tiers)
	b = append(b, "}\n"...)
	return b, nil
}

// tuningGuard refuses the engine's endpoints (/_…) to every caller but the
// pod's own loopback addresses.
const tuningGuard = `            -- The engine's own endpoints (/<route>/_…): in-pod callers only.
            if ngx.var.uri:sub(1, 2) == "/_" and ngx.var.remote_addr ~= "127.0.0.1" and ngx.var.remote_addr ~= "::1" then
                return ngx.exit(ngx.HTTP_FORBIDDEN)
            end
`

// appendLLMLocation writes the body of an llm location: prefix strip,
// lazy registration and admission, proxy through the engine's balancer,
// log; it closes the location.
func (c *compilation) appendLLMLocation(b []byte, tiers []tier) []byte {
	up := upstreamName(c.name)
	route := LuaString(c.name)
	b = c.appendStrip(b)
	// The route's own engine endpoints (/<route>/_…, /_… after the
	// prefix strip) answer in-pod callers only: the dispatch passes the
	// client address as X-Real-IP and the server head restores it, so
	// $remote_addr is the real client. A guard in the one location keeps
	// the peer table written once (a second location with allow/deny
	// would need its own copy of the registration).
	b = append(b, "        access_by_lua_block {\n"+tuningGuard...)
	if c.opts.DynamicPeers {
		b = appendDynamicRegistration(b, c.name, c.llmOptions())
	} else {
		b = c.appendStaticRegistration(b, c.llmOptions(), tiers)
	}
	b = append(b, "        }\n"...)
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
	if c.hasCanary() {
		b = appendHeaderFilter(b, c.name)
	}
	b = append(b, `        log_by_lua_block {
            require("`+LuaModule+`").log(`...)
	b = append(b, route...)
	b = append(b, ")\n        }\n    }\n"...)
	return b
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
	out = c.holdOptions(out)
	slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	return out
}
