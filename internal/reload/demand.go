package reload

// This file: the demand of scale-to-zero routes. The engine reports, on
// its control socket (GET /demand), the requests it holds per route and
// when each route's last request arrived; the sidecar polls it and keeps
// it in the served report on its Pod (served.Report.Demand), which the
// controller reads to wake a route's workload and, with idleAfter, to put
// it back to zero. A report changes when a route's waiting count changes,
// when a route comes or goes, and when its last request is at least
// --demand-granularity later than the one reported: a busy route patches
// the Pod at most once per step.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/internal/served"
)

// DefaultDemandInterval is how often the engine's demand is read
// (--demand-interval): a request held at zero reaches the Pod's report
// within about this long.
const DefaultDemandInterval = 250 * time.Millisecond

// demandAnswer is the engine's GET /demand (docs/lua-contract.md,
// "Holding requests at zero").
type demandAnswer struct {
	Routes map[string]struct {
		Waiting     int     `json:"waiting"`
		LastRequest float64 `json:"last_request"`
	} `json:"routes"`
}

// DemandPoller reads the engine's demand report and hands the served
// report's demand to Set when it changed.
type DemandPoller struct {
	// Path is the engine's control socket.
	Path string
	// Interval is the poll period; Granularity the step of Last.
	Interval, Granularity time.Duration
	// Set receives each new demand (nil = none); it must not block.
	Set func(map[string]served.Demand)
	Log *slog.Logger

	client   *http.Client
	reported map[string]served.Demand
	failing  bool
}

// Run polls until ctx is done. An engine that is not up, or has no
// /demand (an engine without scale to zero), is no error: the demand
// stays as last reported until the engine answers again.
func (d *DemandPoller) Run(ctx context.Context) error {
	path := d.Path
	d.client = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", path)
		},
		DisableKeepAlives: true, // an old worker after a reload knows no new route
	}}
	t := time.NewTicker(d.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		got, err := d.fetch(ctx)
		if err != nil {
			if !d.failing && ctx.Err() == nil {
				d.Log.Debug("cannot read the engine's demand report", "err", err)
			}
			d.failing = true
			continue
		}
		d.failing = false
		if next, changed := nextDemand(d.reported, got, d.Granularity); changed {
			d.reported = next
			d.Set(maps.Clone(next))
		}
	}
}

func (d *DemandPoller) fetch(ctx context.Context) (map[string]served.Demand, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://engine/demand", nil)
	if err != nil {
		return nil, err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /demand: %s", resp.Status)
	}
	var a demandAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, fmt.Errorf("GET /demand: %w", err)
	}
	out := make(map[string]served.Demand, len(a.Routes))
	for route, r := range a.Routes {
		dm := served.Demand{Waiting: max(r.Waiting, 0)}
		if r.LastRequest > 0 && !math.IsInf(r.LastRequest, 0) {
			sec, frac := math.Modf(r.LastRequest)
			dm.Last = time.Unix(int64(sec), int64(frac*1e9)).UTC()
		}
		out[route] = dm
	}
	return out, nil
}

// nextDemand is the demand to report after prev given what the engine
// says now, and whether it differs from prev: a route's waiting count as
// it is, its last request only when at least step later than the
// reported one (or the first), truncated to the second.
func nextDemand(prev, now map[string]served.Demand, step time.Duration) (map[string]served.Demand, bool) {
	next := make(map[string]served.Demand, len(now))
	changed := len(prev) != len(now)
	for route, n := range now {
		p, had := prev[route]
		out := served.Demand{Waiting: n.Waiting, Last: p.Last, StepSeconds: step.Seconds()}
		if !n.Last.IsZero() && (p.Last.IsZero() || n.Last.Sub(p.Last) >= step) {
			out.Last = n.Last.Truncate(time.Second)
		}
		if !had || out != p {
			changed = true
		}
		next[route] = out
	}
	return next, changed
}

// demandSocket is the control socket of sockDir.
func demandSocket(sockDir string) string { return filepath.Join(sockDir, peers.ControlSocket) }
