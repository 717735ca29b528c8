package compiler

import (
	"slices"

	"github.com/modelsphere/autoconfig/schema/routespec"
)

// Failure-mode options of register_route (docs/lua-contract.md, "Failure
// modes"). They are rendered only when spec.failureMode is set, so a route
// without the field renders the same bytes as before the field existed.
const (
	// OptFailureMode carries spec.failureMode (FailOpen or FailClose).
	OptFailureMode = "failure_mode"
	// OptRetryOn says which failed tries move to another peer:
	// "connect-failure" (connection refused, reset before a response, or a
	// connect timeout); never an HTTP status.
	OptRetryOn = "retry_on"
	// OptMaxTries bounds the tries of one request (first try included).
	OptMaxTries = "max_tries"
	// OptEjectConnectFailures is the number of consecutive connection
	// failures after which a peer is ejected; any response (503 included)
	// resets the count.
	OptEjectConnectFailures = "eject_consecutive_connect_failures"
	// OptMaxEjectionPercent caps the share of a backend tier's peers that
	// may be ejected at once (rounded down).
	OptMaxEjectionPercent = "max_ejection_percent"
	// OptEjectionSeconds is how long an ejected peer stays out.
	OptEjectionSeconds = "ejection_seconds"
)

// failOpenConnectTimeout is the llm route's proxy_connect_timeout under
// FailOpen (video routes have their own connect_timeout value).
const failOpenConnectTimeout = "10s"

// failOpenOptions are the FailOpen defaults; spec.nginx.values override
// them key by key (tuning without a code change), except failure_mode,
// which always follows spec.failureMode.
var failOpenOptions = [][2]string{
	{OptRetryOn, "connect-failure"},
	{OptMaxTries, "3"},
	{OptEjectConnectFailures, "3"},
	{OptMaxEjectionPercent, "50"},
	{OptEjectionSeconds, "10"},
}

func (c *compilation) failOpen() bool  { return c.route.Spec.FailureMode == routespec.FailOpen }
func (c *compilation) failClose() bool { return c.route.Spec.FailureMode == routespec.FailClose }

// applyFailureMode adjusts the tiers resolved from spec.nginx.peers:
//
//   - unset: unchanged (byte-identical output to before the field);
//   - FailClose: the listed tiers, minus every non-cart tier below the
//     lowest listed cart tier, so a down cart fails requests instead of
//     being bypassed (whatever the engine does with a lower tier);
//   - FailOpen: the listed tiers, plus the backend pod-IP tier and the
//     backend Service VIP tier when the route does not list them, appended
//     below every listed tier (pod IPs first), so the route always has a
//     path that does not depend on the picker.
func (c *compilation) applyFailureMode(out []tier, llm bool, defaultMax int64) []tier {
	peers := c.route.Spec.Nginx.Peers
	switch {
	case c.failClose():
		lowestCart, hasCart := int32(0), false
		for _, p := range peers {
			if p.Use == routespec.UseCart && (!hasCart || p.Priority < lowestCart) {
				lowestCart, hasCart = p.Priority, true
			}
		}
		if !hasCart {
			return out
		}
		kept := out[:0:0]
		for _, t := range out {
			if t.use != routespec.UseCart && t.priority < lowestCart {
				c.warnf("failureMode FailClose: the %s tier (priority %d) is below the cart tier and is not rendered, so requests fail rather than bypass a down cart; remove it or set failureMode: FailOpen", t.use, t.priority)
				continue
			}
			kept = append(kept, t)
		}
		return kept
	case c.failOpen():
		if len(peers) == 0 {
			return out
		}
		lowest := peers[0].Priority
		for _, p := range peers {
			lowest = min(lowest, p.Priority)
		}
		listed := func(use string) bool {
			return slices.ContainsFunc(peers, func(p routespec.Peer) bool { return p.Use == use })
		}
		added := func(use string, peers []endpoint) tier {
			lowest--
			t := tier{use: use, priority: lowest, peers: peers}
			if llm {
				t.maxConc = defaultMax
				t.probe = c.route.Spec.Nginx.Values["health_probe_path"]
			}
			return t
		}
		if !listed(routespec.UseBackend) {
			out = append(out, added(routespec.UseBackend, c.backends))
		}
		if !listed(routespec.UseBackendSvc) {
			if c.backendSvc != nil {
				out = append(out, added(routespec.UseBackendSvc, []endpoint{*c.backendSvc}))
			} else {
				c.warnf("failureMode FailOpen: no backend Service VIP in the snapshot (%s), so the static last-resort tier is not rendered; the backend pod-IP tier still bypasses the picker", c.noVIPReason())
			}
		}
	}
	return out
}

// noVIPReason says why a FailOpen route has no Service VIP.
func (c *compilation) noVIPReason() string {
	if c.route.Spec.Discovery.Service == "" {
		return "selector discovery: the controller-owned fallback Service has no ClusterIP yet"
	}
	return "headless Service or no ClusterIP"
}

// failureModeOptions adds the failure-mode options to the register_route
// options (nothing when spec.failureMode is unset).
func (c *compilation) failureModeOptions(out [][2]string) [][2]string {
	mode := c.route.Spec.FailureMode
	if mode == "" {
		return out
	}
	has := func(k string) int {
		return slices.IndexFunc(out, func(kv [2]string) bool { return kv[0] == k })
	}
	if i := has(OptFailureMode); i >= 0 {
		if out[i][1] != mode {
			c.warnf("spec.nginx.values.%s %q is replaced by spec.failureMode %q; remove the value", OptFailureMode, out[i][1], mode)
		}
		out[i][1] = mode
	} else {
		out = append(out, [2]string{OptFailureMode, mode})
	}
	if mode == routespec.FailOpen {
		for _, kv := range failOpenOptions {
			if has(kv[0]) < 0 {
				out = append(out, kv)
			}
		}
	}
	return out
}
