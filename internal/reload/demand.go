package reload

// This file: the demand of scale-to-zero routes. The engine reports, on
// its control socket (GET /demand), per route the requests it holds, the
// requests open now (held, waiting for their first byte, streaming), when
// the last request arrived and when the last one ended; the sidecar polls
// it and keeps it in the served report on its Pod (served.Report.Demand),
// which the controller reads to wake a route's workload and, with
// idleAfter, to put it back to zero once no request is open. A report
// changes when a route's waiting count changes, when a route comes or
// goes, when its open count goes from 0 to more or back to 0 (then with
// the end's time), and when its last request or end is at least
// --demand-granularity later than the one reported: a busy route patches
// the Pod at most once per step (other changes of the open count ride
// along). While it reports any demand the sidecar also rewrites the
// report's DemandAt (when it last read the engine) at least every
// served.DemandHeartbeatSteps steps, so the controller can tell a sidecar
// that stopped from an idle route.

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
		Open        int     `json:"open"`
		LastRequest float64 `json:"last_request"`
		LastEnd     float64 `json:"last_end"`
	} `json:"routes"`
}

// DemandPoller reads the engine's demand report and hands the served
// report's demand to Set when it changed, and again as a heartbeat.
type DemandPoller struct {
	// Path is the engine's control socket.
	Path string
	// Interval is the poll period; Granularity the step of Last.
	Interval, Granularity time.Duration
	// Set receives each new demand (nil = none) and when the engine was
	// read (served.Report.DemandAt); it must not block.
	Set func(map[string]served.Demand, time.Time)
	Log *slog.Logger

	client   *http.Client
	reported map[string]served.Demand
	setAt    time.Time // when Set was last called
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
		at := time.Now().UTC()
		if next, ok := d.observe(got, at); ok {
			d.Set(next, at)
		}
	}
}

// observe takes what the engine said at time at: the demand to hand to
// Set and whether to — when it changed (nextDemand), or as the heartbeat
// once DemandHeartbeatSteps steps passed since the last Set while any
// route's demand is reported. A poll that fails is no read: no heartbeat.
func (d *DemandPoller) observe(got map[string]served.Demand, at time.Time) (map[string]served.Demand, bool) {
	next, changed := nextDemand(d.reported, got, d.Granularity)
	if !changed {
		if len(d.reported) == 0 || at.Sub(d.setAt) < served.DemandHeartbeatSteps*d.Granularity {
			return nil, false
		}
		next = d.reported
	}
	d.reported, d.setAt = next, at
	return maps.Clone(next), true
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
		dm := served.Demand{Waiting: max(r.Waiting, 0), Open: max(r.Open, 0), Last: unixTime(r.LastRequest)}
		if end := unixTime(r.LastEnd); end.After(dm.Last) {
			dm.Last = end
		}
		out[route] = dm
	}
	return out, nil
}

// unixTime is the engine's time t (unix seconds, fractional; 0 = none)
// in UTC; the zero time for 0 or a value that is no time.
func unixTime(t float64) time.Time {
	if !(t > 0) || math.IsInf(t, 0) {
		return time.Time{}
	}
	sec, frac := math.Modf(t)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC()
}

// nextDemand is the demand to report after prev given what the engine
// says now, and whether it differs from prev: a route's waiting count as
// it is; its last request or end (the later) only when at least step
// later than the reported one (or the first), truncated to the second;
// its open count at once when it goes from 0 to more or back to 0 (then
// with the end's time as Last, whatever the step: the controller counts
// idleAfter from there), otherwise only along with a change of Last.
// Truncating to the second makes Last up to a second earlier than the
// true end, which only delays a scale to zero.
func nextDemand(prev, now map[string]served.Demand, step time.Duration) (map[string]served.Demand, bool) {
	next := make(map[string]served.Demand, len(now))
	changed := len(prev) != len(now)
	for route, n := range now {
		p, had := prev[route]
		out := served.Demand{Waiting: n.Waiting, Open: p.Open, Last: p.Last, StepSeconds: step.Seconds()}
		moved := false
		if !n.Last.IsZero() && (p.Last.IsZero() || n.Last.Sub(p.Last) >= step) {
			out.Last = n.Last.Truncate(time.Second)
			moved = true
		}
		busy := (p.Open > 0) != (n.Open > 0)
		if !had || moved || busy {
			out.Open = n.Open
		}
		if busy && n.Open == 0 && n.Last.Truncate(time.Second).After(out.Last) {
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
