package compiler

// This file: scale to zero (spec.scaleToZero). At zero ready endpoints
// such a route renders no tiers at all, and its engine options carry the
// hold: the engine holds each request (up to hold_timeout) until a peer
// arrives, instead of the route keeping dead peers. Every other route
// still fails with ErrNoBackends at zero, so nothing empty is written
// for it.

import (
	"strconv"

	"github.com/modelsphere/autoconfig/schema/routespec"
)

// Engine options of a scale-to-zero route (docs/lua-contract.md, "Holding
// requests at zero").
const (
	// OptHoldTimeout is how long, in whole seconds, the engine holds a
	// request while the route has no live peer.
	OptHoldTimeout = "hold_timeout"
	// OptHoldMax caps the requests one engine holds for the route; absent
	// = the engine's default (routespec.DefaultHoldMaxRequests). An llm
	// route may set it as a value.
	OptHoldMax = "hold_max"
)

// ReasonScaledToZero is the condition reason of a scale-to-zero route
// with no ready endpoint (Result.ScaledToZero): not a failure, the
// engine holds requests while the target wakes.
const ReasonScaledToZero = "ScaledToZero"

// scaleToZero reports a route with spec.scaleToZero.
func (c *compilation) scaleToZero() bool { return c.route.Spec.ScaleToZero != nil }

// HoldTimeoutSeconds is a scale-to-zero route's hold in seconds (the
// default when holdTimeout is empty), 0 without spec.scaleToZero.
func HoldTimeoutSeconds(route *Route) int {
	s := route.Spec.ScaleToZero
	if s == nil {
		return 0
	}
	if s.HoldTimeout == "" {
		return routespec.Seconds(routespec.DefaultHoldTimeout)
	}
	return routespec.Seconds(s.HoldTimeout)
}

// holdOptions adds the hold option of a scale-to-zero route to the
// registration options (unsorted; the caller sorts). Other routes get
// nothing: their options stay as before the field existed.
func (c *compilation) holdOptions(out [][2]string) [][2]string {
	if !c.scaleToZero() {
		return out
	}
	return append(out, [2]string{OptHoldTimeout, strconv.Itoa(HoldTimeoutSeconds(c.route))})
}
