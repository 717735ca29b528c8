package compiler

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"

	"github.com/modelsphere/autoconfig/schema/routespec"
)

// tier is one rendered peer group.
type tier struct {
	use      string
	priority int32
	// maxConc is the per-peer concurrency limit; 0 = none rendered.
	maxConc int64
	// probe is the health-probe path; "" = none rendered.
	probe string
	peers []endpoint
}

// tiers resolves spec.nginx.peers against the snapshot, highest priority
// first (spec order among equal priorities). A tier without peers is skipped
// with a warning; no tier at all is ErrNoPeers.
func (c *compilation) tiers(llm bool) ([]tier, error) {
	spec := c.route.Spec
	var backendLimit int64
	for _, p := range spec.Nginx.Peers {
		if p.Use == routespec.UseBackend {
			backendLimit = int64(p.MaxConcurrency)
		}
	}
	defaultMax := int64(0)
	if llm {
		if v, ok := spec.Nginx.Values["default_max"]; ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil && n > 0 {
				defaultMax = n
			} else {
				c.warnf("spec.nginx.values.default_max %q is not a positive whole number; tiers without maxConcurrency render no max_concurrency (the engine's own default applies)", v)
			}
		}
	}
	out := make([]tier, 0, len(spec.Nginx.Peers))
	for i, p := range spec.Nginx.Peers {
		t := tier{use: p.Use, priority: p.Priority, maxConc: int64(p.MaxConcurrency), probe: p.ProbePath}
		switch p.Use {
		case routespec.UseCart:
			if c.cartSvc == nil {
				c.skipTier(i, p.Use, "the CART Service has no ClusterIP in the snapshot")
				continue
			}
			t.peers = []endpoint{*c.cartSvc}
			if p.MaxConcurrencyFromBackend {
				t.maxConc = backendLimit * int64(len(c.backends))
			}
			if t.probe == "" {
				t.probe = "/health"
			}
		case routespec.UseBackend:
			t.peers = c.backends
		case routespec.UseBackendSvc:
			// A FailOpen route in selector mode gets the controller-owned
			// fallback Service's VIP (docs/failure-modes.md).
			if spec.Discovery.Service == "" && !(c.failOpen() && c.backendSvc != nil) {
				c.skipTier(i, p.Use, "discovery uses a selector, so there is no backend Service VIP for the static last-resort tier")
				continue
			}
			if c.backendSvc == nil {
				c.skipTier(i, p.Use, "the backend Service has no ClusterIP in the snapshot (headless Service?), so there is no static last-resort tier")
				continue
			}
			t.peers = []endpoint{*c.backendSvc}
		default:
			c.res.Skipped = append(c.res.Skipped, SkippedTier{Index: i, Use: p.Use, Reason: fmt.Sprintf("unknown use %q", p.Use)})
			c.warnf("spec.nginx.peers[%d] skipped: unknown use %q", i, p.Use)
			continue
		}
		if llm {
			if t.maxConc == 0 {
				t.maxConc = defaultMax
			}
			if t.probe == "" {
				t.probe = spec.Nginx.Values["health_probe_path"]
			}
		}
		out = append(out, t)
	}
	out = c.applyFailureMode(out, llm, defaultMax)
	if len(out) == 0 {
		return nil, ErrNoPeers
	}
	slices.SortStableFunc(out, func(a, b tier) int { return cmp.Compare(b.priority, a.priority) })
	return out, nil
}

// skipTier records a peers entry that renders no tier, as a warning (the
// same text as always) and in Result.Skipped.
func (c *compilation) skipTier(i int, use, reason string) {
	c.res.Skipped = append(c.res.Skipped, SkippedTier{Index: i, Use: use, Reason: reason})
	c.warnf("spec.nginx.peers[%d] (use: %s) skipped: %s", i, use, reason)
}
