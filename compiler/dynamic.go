package compiler

// This file: dynamic peers (Options.DynamicPeers; the consumer declared
// peers.Annotation). The route file registers the route with
// register_dynamic_route and holds nothing that depends on endpoints; the
// route's tiers go to the peers table, peers.Key(route) in the same
// ConfigMap, which the reload sidecar pushes into the running engine.

import (
	"slices"
	"strconv"
	"strings"

	"github.com/modelsphere/autoconfig/internal/peers"
)

// Options of a dynamic video route's registration (register_dynamic_route)
// besides the failure-mode ones.
const (
	// OptAdmission "off": the engine never answers 503 for a full peer
	// (nginx's max_conns queues nothing either); the balancer still
	// prefers peers with a free slot.
	OptAdmission = "admission"
	// OptKind tells the engine what kind of route registers ("video").
	OptKind = "kind"
)

// videoDynamicOptions are the register_dynamic_route options of every
// dynamic video route, sorted by key: the semantics of the static video
// upstream (max_fails=3 fail_timeout=10s: ejected after 3 connect failures
// for 10 s; backup tiers only while every primary is out; a refused
// connection moves on, at most videoUpstreamTries tries; no 503 of its own).
var videoDynamicOptions = [][2]string{
	{OptAdmission, "off"},
	{OptEjectConnectFailures, "3"},
	{OptEjectionSeconds, "10"},
	{OptKind, "video"},
	{OptMaxEjectionPercent, "100"},
	{OptMaxTries, strconv.Itoa(videoUpstreamTries)},
	{OptRetryOn, "connect-failure"},
}

// videoEngineOptions are a video route's engine registration options:
// videoDynamicOptions, with the hold of a scale-to-zero route.
func (c *compilation) videoEngineOptions() [][2]string {
	if !c.scaleToZero() {
		return videoDynamicOptions
	}
	out := c.holdOptions(slices.Clone(videoDynamicOptions))
	slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	return out
}

// appendDynamicRegistration writes the access-phase lua that registers a
// route whose tiers come from its peers table, then admits the request
// (inside an access_by_lua_block). opts are the registration options, in
// the order written.
func appendDynamicRegistration(b []byte, name string, opts [][2]string) []byte {
	return appendRegistration(b, name, "register_dynamic_route", opts, nil)
}

// peersTable is the content of the route's peers key: exactly the tiers
// the static route file renders, highest priority first.
func (c *compilation) peersTable(tiers []tier) ([]byte, error) {
	t := peers.Table{Route: c.name, Owner: OwnerRef(c.route.Namespace, c.route.Name), Tiers: make([]peers.Tier, len(tiers))}
	for i, tr := range tiers {
		t.Tiers[i] = peersTier(tr)
	}
	if c.hasCanary() {
		t.Canary = c.peersCanary(c.canaryTier(!c.video))
	}
	return t.Encode()
}

// peersTier is a rendered tier as a peers table's tier.
func peersTier(tr tier) peers.Tier {
	ps := make([]peers.Peer, len(tr.peers))
	for j := range tr.peers {
		ps[j] = peers.Peer{Host: tr.peers[j].ip, Port: tr.peers[j].port}
	}
	return peers.Tier{Use: tr.use, Priority: tr.priority, MaxConcurrency: tr.maxConc, ProbePath: tr.probe, Peers: ps}
}
