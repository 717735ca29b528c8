package compiler

// This file: spec.canary (issue 30). A route with a canary is served by
// two model versions: the stable one (spec.discovery: every tier the route
// lists, cart and backend-svc included) and the canary (spec.canary.discovery:
// one tier of its own, use "canary"). The engine (router.lua) chooses a
// request's version; docs/lua-contract.md ("Canary") is the contract. A
// route without spec.canary renders exactly as before the field existed.

import (
	"fmt"
	"strconv"

	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// UseCanary is the use of the canary's tier (register_route's canary
// argument, the peers table's canary.tiers).
const UseCanary = "canary"

// ReasonCanaryNoBackends is the condition reason for a route whose canary
// has no endpoint (Result.CanaryNoBackends): not an error, every request
// falls through to the stable version, but the split is not what the
// route asks.
const ReasonCanaryNoBackends = "CanaryNoBackends"

// canarySplit is a route's split with the defaults filled.
type canarySplit struct {
	weight                   int32
	sticky, override, cookie string
}

// split is the route's canary split (spec.canary, spec.split with empty
// fields as their defaults).
func (c *compilation) split() canarySplit {
	s := canarySplit{weight: c.route.Spec.Canary.Weight, sticky: routespec.DefaultStickyHeader,
		override: routespec.DefaultOverrideHeader, cookie: routespec.DefaultStickyCookie}
	if sp := c.route.Spec.Split; sp != nil {
		if sp.StickyHeader != "" {
			s.sticky = sp.StickyHeader
		}
		if sp.OverrideHeader != "" {
			s.override = sp.OverrideHeader
		}
		if sp.StickyCookie != "" {
			s.cookie = sp.StickyCookie
		}
	}
	return s
}

// hasCanary reports whether the route has a canary.
func (c *compilation) hasCanary() bool { return c.route.Spec.Canary != nil }

// checkCanary reads the snapshot's canary backends of a route with a
// canary: malformed or unnormalised lists fail as the stable ones do;
// none at all is a warning and Result.CanaryNoBackends.
func (c *compilation) checkCanary(snap Snapshot) error {
	if !c.hasCanary() {
		return nil
	}
	if w := c.route.Spec.Canary.Weight; w < 0 || w > 100 {
		return fmt.Errorf("spec.canary.weight %d is not a percent from 0 to 100", w)
	}
	var err error
	if c.canary, err = checkEndpoints(snap.CanaryBackends, "canary backend"); err != nil {
		return err
	}
	if len(c.canary) == 0 {
		c.res.CanaryNoBackends = true
		c.warnf("spec.canary: no canary backend endpoints discovered; every request falls through to the stable version (%s)", ReasonCanaryNoBackends)
	}
	return nil
}

// canaryTier is the canary's one tier: the canary backends, with the
// priority, max_concurrency and probe path the route's backend entry
// renders (spec.nginx.peers use backend; for llm routes default_max and
// health_probe_path as for that tier).
func (c *compilation) canaryTier(llm bool) tier {
	spec := c.route.Spec
	t := tier{use: UseCanary, peers: c.canary}
	for _, p := range spec.Nginx.Peers {
		if p.Use == routespec.UseBackend {
			t.priority, t.maxConc, t.probe = p.Priority, int64(p.MaxConcurrency), p.ProbePath
			break
		}
	}
	if llm {
		if t.maxConc == 0 {
			if n, err := strconv.ParseInt(spec.Nginx.Values["default_max"], 10, 64); err == nil && n > 0 {
				t.maxConc = n
			}
		}
		if t.probe == "" {
			t.probe = spec.Nginx.Values["health_probe_path"]
		}
	}
	return t
}

// appendCanaryArg writes register_route's fourth argument, the canary:
// weight, split keys and its tiers (inside the call, after the tiers).
func (c *compilation) appendCanaryArg(b []byte, ct tier) []byte {
	s := c.split()
	b = append(b, "                }, {\n                    [ \"weight\" ] = "...)
	b = strconv.AppendInt(b, int64(s.weight), 10)
	b = append(b, ",\n                    [ \"sticky_header\" ] = "...)
	b = appendLuaString(b, s.sticky)
	b = append(b, ",\n                    [ \"override_header\" ] = "...)
	b = appendLuaString(b, s.override)
	b = append(b, ",\n                    [ \"sticky_cookie\" ] = "...)
	b = appendLuaString(b, s.cookie)
	b = append(b, ",\n                    [ \"tiers\" ] = {\n"...)
	b = appendLuaTier(b, ct, "                        ")
	return append(b, "                    },\n"...)
}

// appendHeaderFilter writes a canary route's header filter: the engine
// names the version served (X-Model-Version) and sets the sticky cookie.
func appendHeaderFilter(b []byte, name string) []byte {
	b = append(b, "        header_filter_by_lua_block {\n            require(\""+LuaModule+"\").header("...)
	b = appendLuaString(b, name)
	return append(b, ")\n        }\n"...)
}

// peersCanary is the peers table's canary.
func (c *compilation) peersCanary(ct tier) *peers.Canary {
	s := c.split()
	return &peers.Canary{Weight: s.weight, StickyHeader: s.sticky, OverrideHeader: s.override, StickyCookie: s.cookie,
		Tiers: []peers.Tier{peersTier(ct)}}
}
