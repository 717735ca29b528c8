package compiler

import (
	"fmt"
	"hash/fnv"
	"math/big"
	"regexp"
	"strconv"
	"strings"
)

// Video option defaults; the schema fills the same ones, these cover a
// route that reaches the compiler without them.
var videoDefaults = map[string]string{
	"max_body_size":     "64m",
	"proxy_timeout":     "3600s",
	"connect_timeout":   "10s",
	"auth_public_paths": "~^/v2/video_generation/[^/]+/content$",
	"upload_limit_key":  "$http_x_real_ip",
}

// Forms of the values written unquoted into directives. The schema enforces
// the same; checking again here means no value can inject a directive even
// when a caller skipped validation.
var (
	reSize     = regexp.MustCompile(`^[0-9]{1,12}[kKmMgG]?$`)
	reTime     = regexp.MustCompile(`^([0-9]{1,9}(ms|s|m|h|d))+$|^[0-9]{1,9}$`)
	reCount    = regexp.MustCompile(`^[1-9][0-9]{0,8}$`)
	reBurst    = regexp.MustCompile(`^[1-9][0-9]{0,8}$`)
	reReqRate  = regexp.MustCompile(`^[1-9][0-9]{0,8}r/[sm]$`)
	reVar      = regexp.MustCompile(`^\$[a-z_][a-z0-9_]*$`)
	reBitsRate = regexp.MustCompile(`^([0-9]+(\.[0-9]+)?)(bps|Kbps|Mbps|Gbps)$`)
)

// videoUpstreamTries bounds proxy_next_upstream_tries: a refused
// connection moves on to another peer, but a request never walks a whole
// large pool.
const videoUpstreamTries = 3

// renderVideo writes the video route file from the route's tiers
// (c.tiers(false)): a plain reverse proxy (see docs/outputs.md). With
// Options.DynamicPeers the upstream is the engine's balancer and the
// access phase registers the route (register_dynamic_route): the peers
// table carries the tiers. The file is three parts: the http-level
// directives (appendVideoHTTP), the upstream, and the server with its one
// location (appendVideoLocation).
func (c *compilation) renderVideo(tiers []tier) ([]byte, error) {
	v, err := c.videoValues()
	if err != nil {
		return nil, err
	}
	n := 0
	for _, t := range tiers {
		n += len(t.peers)
	}
	// engine: the upstream is the engine's balancer (dynamic peers, or a
	// canary: the engine chooses each request's version and falls through
	// to the other when the chosen one has no live peer, which two plain
	// nginx upstreams cannot tell lua).
	engine := c.opts.DynamicPeers || c.hasCanary() || c.scaleToZero()
	var dict string
	if engine {
		if dict, err = c.sharedDictSize(); err != nil {
			return nil, err
		}
	}
	b := make([]byte, 0, 4096+96*(n+len(c.canary)))
	b = c.appendHeader(b)
	if engine {
		b = appendSharedDict(b, c.name, dict)
	}
	b = c.appendVideoHTTP(b, &v)
	if engine {
		b = appendBalancerUpstream(b, c.name)
	} else {
		b = appendVideoUpstream(b, upstreamName(c.name), tiers, n)
	}
	b = c.appendServerHead(b)
	b = append(b, "    client_max_body_size "...)
	b = append(b, v.bodySize...)
	b = append(b, ";\n\n    location / {\n"...)
	b = c.appendVideoLocation(b, &v, tiers, engine)
	b = append(b, "    }\n}\n"...)
	return b, nil
}

// videoValues are a video route's spec.nginx.values as the file writes
// them: checked against the forms nginx accepts, defaults filled.
type videoValues struct {
	bodySize, proxyTimeout, connectTimeout string
	// connLimit, reqLimit, reqBurst: the upload limits, "" for none;
	// limitKey is the key of their zones.
	connLimit, reqLimit, reqBurst, limitKey string
	// rate and rateAfter are limit_rate and limit_rate_after in bytes
	// (rate_limit converted), "" without a rate_limit.
	rate, rateAfter string
	// keys and public are api_keys (comma-separated, "" for no key
	// check) and auth_public_paths.
	keys, public string
}

// videoVal is the value of spec.nginx.values key k, or its video default.
func (c *compilation) videoVal(k string) string {
	if v, ok := c.route.Spec.Nginx.Values[k]; ok {
		return v
	}
	return videoDefaults[k]
}

// videoValues reads and checks the route's video values; an error names
// the first value nginx would not accept.
func (c *compilation) videoValues() (videoValues, error) {
	var v videoValues
	var err error
	check := func(k string, re *regexp.Regexp, dst *string) {
		if err != nil {
			return
		}
		if *dst = c.videoVal(k); *dst != "" && !re.MatchString(*dst) {
			err = fmt.Errorf("spec.nginx.values.%s %q is not in a form nginx accepts", k, *dst)
		}
	}
	check("max_body_size", reSize, &v.bodySize)
	check("proxy_timeout", reTime, &v.proxyTimeout)
	check("connect_timeout", reTime, &v.connectTimeout)
	check("upload_conn_limit", reCount, &v.connLimit)
	check("upload_req_limit", reReqRate, &v.reqLimit)
	check("upload_req_burst", reBurst, &v.reqBurst)
	check("upload_limit_key", reVar, &v.limitKey)
	if err != nil {
		return v, err
	}
	if r := c.videoVal("rate_limit"); r != "" {
		if v.rate, err = RateLimitBytes(r); err != nil {
			return v, fmt.Errorf("spec.nginx.values.rate_limit: %w", err)
		}
		after := c.videoVal("rate_limit_after")
		if after == "" {
			after = "1m"
		}
		if !reSize.MatchString(after) {
			return v, fmt.Errorf("spec.nginx.values.rate_limit_after %q is not an nginx size", after)
		}
		v.rateAfter = nginxSize(after)
	}
	for _, s := range []string{v.bodySize, v.proxyTimeout, v.connectTimeout} {
		if s == "" {
			return v, fmt.Errorf("max_body_size, proxy_timeout and connect_timeout must not be empty")
		}
	}
	v.keys, v.public = c.videoVal("api_keys"), c.videoVal("auth_public_paths")
	return v, nil
}

// appendVideoHTTP writes the http-level directives: the upload limits'
// zones and the maps of the forwarded headers. This file is included
// inside http{}, shared with every other route, so every name carries the
// route's identifier.
func (c *compilation) appendVideoHTTP(b []byte, v *videoValues) []byte {
	connZone, reqZone := limitZones(upstreamName(c.name), v.limitKey)
	fwd := videoVarPrefix(c.name)
	if v.connLimit != "" {
		b = append(b, "limit_conn_zone "...)
		b = append(b, v.limitKey...)
		b = append(b, " zone="...)
		b = append(b, connZone...)
		b = append(b, ":1m;\n"...)
	}
	if v.reqLimit != "" {
		b = append(b, "limit_req_zone "...)
		b = append(b, v.limitKey...)
		b = append(b, " zone="...)
		b = append(b, reqZone...)
		b = append(b, ":1m rate="...)
		b = append(b, v.reqLimit...)
		b = append(b, ";\n"...)
	}
	b = append(b, "map $http_x_forwarded_proto $"...)
	b = append(b, fwd...)
	b = append(b, "_fwd_proto {\n    default $http_x_forwarded_proto;\n    \"\" $scheme;\n}\nmap $http_x_forwarded_host $"...)
	b = append(b, fwd...)
	return append(b, "_fwd_host {\n    default $http_x_forwarded_host;\n    \"\" $host;\n}\n\n"...)
}

// appendVideoLocation writes the body of the video location: prefix
// strip, the access phase (appendVideoAccess), the upload limits, the
// proxy (appendVideoProxy), and with the engine its log phase; it leaves
// the location open.
func (c *compilation) appendVideoLocation(b []byte, v *videoValues, tiers []tier, engine bool) []byte {
	b = c.appendStrip(b)
	b = c.appendVideoAccess(b, v, tiers, engine)
	connZone, reqZone := limitZones(upstreamName(c.name), v.limitKey)
	if v.connLimit != "" {
		b = append(b, "        limit_conn "...)
		b = append(b, connZone...)
		b = append(b, ' ')
		b = append(b, v.connLimit...)
		b = append(b, ";\n"...)
	}
	if v.reqLimit != "" {
		b = append(b, "        limit_req zone="...)
		b = append(b, reqZone...)
		if v.reqBurst != "" {
			b = append(b, " burst="...)
			b = append(b, v.reqBurst...)
		}
		b = append(b, ";\n"...)
	}
	b = c.appendVideoProxy(b, v)
	if c.hasCanary() {
		b = appendHeaderFilter(b, c.name)
	}
	if engine {
		// The engine releases the try's slot and counts a connection
		// failure (ejection after 3) when the request ends.
		b = append(b, "        log_by_lua_block {\n            require(\""+LuaModule+"\").log("...)
		b = append(b, LuaString(c.name)...)
		b = append(b, ")\n        }\n"...)
	}
	return b
}

// appendVideoAccess writes the location's access phase: the API key check
// and, for a route the engine serves, its registration and the engine's
// access, in one access_by_lua_block.
func (c *compilation) appendVideoAccess(b []byte, v *videoValues, tiers []tier, engine bool) []byte {
	if !engine {
		if v.keys != "" {
			b = appendVideoAuth(b, v.keys, v.public)
		}
		return b
	}
	b = append(b, "        access_by_lua_block {\n"...)
	if v.keys != "" {
		b = appendVideoAuthCheck(b, v.keys, v.public)
	}
	if c.opts.DynamicPeers {
		b = appendDynamicRegistration(b, c.name, c.videoEngineOptions())
	} else {
		// A static canary or scale-to-zero route: registered with its
		// tiers (and the canary), with the dynamic video options (the
		// static upstream's semantics).
		b = c.appendStaticRegistration(b, c.videoEngineOptions(), tiers)
	}
	return append(b, "        }\n"...)
}

// appendVideoProxy writes the location's proxy directives: the upstream,
// the forwarded headers, the timeouts and retries, and the buffering (off,
// or on in memory under a rate limit).
func (c *compilation) appendVideoProxy(b []byte, v *videoValues) []byte {
	fwd := videoVarPrefix(c.name)
	b = append(b, "        proxy_pass http://"...)
	b = append(b, upstreamName(c.name)...)
	b = append(b, ";\n"...)
	b = append(b, `        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_set_header X-Real-IP $remote_addr;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_set_header X-Forwarded-Host $`...)
	b = append(b, fwd...)
	b = append(b, "_fwd_host;\n        proxy_set_header X-Forwarded-Proto $"...)
	b = append(b, fwd...)
	b = append(b, "_fwd_proto;\n        proxy_set_header Range $http_range;\n        proxy_set_header If-Range $http_if_range;\n        proxy_connect_timeout "...)
	b = append(b, v.connectTimeout...)
	b = append(b, ";\n        proxy_read_timeout "...)
	b = append(b, v.proxyTimeout...)
	b = append(b, ";\n        proxy_send_timeout "...)
	b = append(b, v.proxyTimeout...)
	b = append(b, ";\n        # A refused or timed-out connection moves on to another peer (nothing\n        # was sent); a 503 answer is passed back and ejects no one.\n        proxy_next_upstream error timeout;\n        proxy_next_upstream_tries "...)
	tries := int64(videoUpstreamTries)
	if c.hasCanary() {
		// The engine's extra try: the fallthrough to the other version.
		tries++
	}
	b = strconv.AppendInt(b, tries, 10)
	b = append(b, ";\n"...)
	if v.rate == "" {
		return append(b, "        proxy_buffering off;\n"...)
	}
	// limit_rate is ignored while proxy_buffering is off; buffer in
	// memory only, so a slow client back-pressures the upstream.
	b = append(b, "        proxy_buffering on;\n        proxy_max_temp_file_size 0;\n        proxy_ignore_headers X-Accel-Buffering X-Accel-Limit-Rate;\n        limit_rate "...)
	b = append(b, v.rate...)
	b = append(b, ";\n        limit_rate_after "...)
	b = append(b, v.rateAfter...)
	return append(b, ";\n"...)
}

// appendVideoUpstream writes the static video upstream: the highest tier
// is primary; lower tiers are backup servers, used only while every
// primary is down (not while one answers 503). n is the number of peers.
func appendVideoUpstream(b []byte, up string, tiers []tier, n int) []byte {
	b = append(b, "upstream "...)
	b = append(b, up...)
	b = append(b, " {\n    zone "...)
	b = append(b, up...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(64+n), 10)
	b = append(b, "k;\n"...)
	for ti, t := range tiers {
		for i := range t.peers {
			b = append(b, "    server "...)
			b = t.peers[i].appendHostPort(b)
			b = append(b, " max_fails=3 fail_timeout=10s"...)
			if t.maxConc > 0 {
				b = append(b, " max_conns="...)
				b = strconv.AppendInt(b, t.maxConc, 10)
			}
			if ti > 0 && t.priority < tiers[0].priority {
				b = append(b, " backup"...)
			}
			b = append(b, ";\n"...)
		}
	}
	return append(b, "}\n\n"...)
}

// appendVideoAuth renders the API key check: lua compares the Bearer token
// byte for byte with each key (an nginx map would compare plain strings
// case-insensitively), after the public-path exemption. Keys and the path
// go through LuaString, so no byte of them reaches nginx's or lua's lexer
// unescaped.
func appendVideoAuth(b []byte, keys, public string) []byte {
	b = append(b, "        access_by_lua_block {\n"...)
	b = appendVideoAuthCheck(b, keys, public)
	return append(b, "        }\n"...)
}

// appendVideoAuthCheck writes the lua of the API key check (the body of
// appendVideoAuth's access_by_lua_block): a request without a valid key
// ends with 401 here.
func appendVideoAuthCheck(b []byte, keys, public string) []byte {
	b = append(b, "            local uri = ngx.var.uri\n"...)
	switch {
	case public == "":
		b = append(b, "            local public = false\n"...)
	case strings.HasPrefix(public, "~*"):
		b = append(b, "            local public = ngx.re.find(uri, "...)
		b = appendLuaString(b, public[2:])
		b = append(b, ", \"joi\") ~= nil\n"...)
	case strings.HasPrefix(public, "~"):
		b = append(b, "            local public = ngx.re.find(uri, "...)
		b = appendLuaString(b, public[1:])
		b = append(b, ", \"jo\") ~= nil\n"...)
	default:
		b = append(b, "            local public = uri == "...)
		b = appendLuaString(b, public)
		b = append(b, "\n"...)
	}
	b = append(b, "            if not public then\n                local auth = ngx.var.http_authorization\n                local token = auth and string.match(auth, \"^[Bb][Ee][Aa][Rr][Ee][Rr] +(.+)$\")\n                if not token or not ("...)
	for i, k := range strings.Split(keys, ",") {
		if i > 0 {
			b = append(b, " or "...)
		}
		b = append(b, "token == "...)
		b = appendLuaString(b, k)
	}
	b = append(b, ") then\n                    ngx.header[\"WWW-Authenticate\"] = \"Bearer\"\n                    return ngx.exit(401)\n                end\n            end\n"...)
	return b
}

// RateLimitBytes converts a video rate_limit to the bytes per second
// limit_rate takes: bits per second (bps, Kbps, Mbps, Gbps; decimal units,
// fractions allowed) are divided by 8 and rounded down, "200Mbps" →
// "25000000", "1.5Gbps" → "187500000", but never below 1 (nginx's least
// limit: "1bps" → "1"); nginx sizes pass through ("25m",
// "512k", plain bytes), except "g", which limit_rate does not accept and
// which becomes plain bytes.
func RateLimitBytes(v string) (string, error) {
	if m := reBitsRate.FindStringSubmatch(v); m != nil {
		r, ok := new(big.Rat).SetString(m[1])
		if !ok {
			return "", fmt.Errorf("%q: bad number", v)
		}
		unit := map[string]int64{"bps": 1, "Kbps": 1e3, "Mbps": 1e6, "Gbps": 1e9}[m[3]]
		r.Mul(r, big.NewRat(unit, 8))
		q := new(big.Int).Quo(r.Num(), r.Denom())
		if q.Sign() <= 0 && r.Sign() > 0 {
			// Below one byte per second (1bps, 0.001Kbps): nginx counts
			// whole bytes, so the least limit it has.
			q.SetInt64(1)
		}
		if q.Sign() <= 0 {
			return "", fmt.Errorf("%q is not a positive rate", v)
		}
		if !q.IsInt64() {
			return "", fmt.Errorf("%q is too large", v)
		}
		return q.String(), nil
	}
	if !reSize.MatchString(v) || v == "0" {
		return "", fmt.Errorf("%q is neither bits per second (200Mbps) nor an nginx size (25m)", v)
	}
	return nginxSize(v), nil
}

// nginxSize rewrites a "g" size as plain bytes (nginx's size parser, used
// by limit_rate and limit_rate_after, knows only k and m).
func nginxSize(v string) string {
	if last := v[len(v)-1]; last == 'g' || last == 'G' {
		n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
		if err == nil && n <= 1<<33 {
			return strconv.FormatInt(n<<30, 10)
		}
	}
	return v
}

// maxVarName is the longest variable name nginx's variables hash holds
// with its default variables_hash_bucket_size of 64 (an entry is the name
// plus 10 bytes, 8-aligned, next to an 8-byte terminator): a longer one
// fails the whole http{} ("could not build variables_hash"), every route's.
const maxVarName = 46

// videoVarPrefix names a video route's map variables
// (<prefix>_fwd_proto, <prefix>_fwd_host): the upstream name, as always,
// while the variable fits maxVarName; for longer route names
// "ac_" and a 64-bit FNV-1a hash of the route name instead.
func videoVarPrefix(route string) string {
	up := upstreamName(route)
	if len(up)+len("_fwd_proto") <= maxVarName {
		return up
	}
	h := fnv.New64a()
	h.Write([]byte(route))
	return fmt.Sprintf("ac_%016x", h.Sum64())
}

// DefaultLimitKey is the video upload_limit_key default.
const DefaultLimitKey = "$http_x_real_ip"

// limitZones names a video route's limit_conn and limit_req zones. nginx
// keeps a zone across a reload only with the same key and refuses the
// reload otherwise (of the whole shared http{}), so a zone's name carries
// its key: <upstream>_conn and <upstream>_req for the default key, as
// always, and a hash of the key appended for any other.
func limitZones(up, key string) (conn, req string) {
	conn, req = up+"_conn", up+"_req"
	if key != DefaultLimitKey {
		h := fnv.New32a()
		h.Write([]byte(key))
		sum := fmt.Sprintf("_%08x", h.Sum32())
		conn, req = conn+sum, req+sum
	}
	return conn, req
}
