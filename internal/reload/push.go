package reload

// This file: dynamic peers. When the engine listens on its control socket
// (<sock-dir>/autoconfig@control.sock, internal/peers), a change that
// touches only peers tables (peers_<route>.json) is pushed into the
// running engine instead of reloading it: no check, no signal, no new
// worker generation. Every other change still goes check → signal, and
// after it every table is pushed again (a new route's dict exists only
// after the reload). A new target master gets every table too.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/internal/served"
)

// Results of one push, the values of peers_pushes_total{result}.
const (
	PushAccepted = "accepted" // the engine answered with the table's version
	PushRefused  = "refused"  // the engine refused the table (malformed, full dict, older serial)
	PushNoRoute  = "no_route" // the engine has no such route yet: a reload must come first
	PushError    = "error"    // no answer, an unreadable file, a table that does not parse
)

// pushTimeout bounds one push (10,000 peers are acknowledged in ≈ 40 ms).
const pushTimeout = 10 * time.Second

// errNoRoute: the engine does not know the route (its configuration must
// be reloaded first).
var errNoRoute = errors.New("the engine has no such route")

// errRefused: the engine answered, and did not take the table.
var errRefused = errors.New("the engine refused the table")

// pushAnswer is the engine's answer to a push and to a read.
type pushAnswer struct {
	Route   string `json:"route"`
	Version string `json:"version"`
	Serial  int64  `json:"serial"`
	Peers   int    `json:"peers"`
	Error   string `json:"error"`
}

// controlPath is the engine's control socket ("" without --sock-dir).
func (r *Reloader) controlPath() string {
	if r.opts.SockDir == "" {
		return ""
	}
	return filepath.Join(r.opts.SockDir, peers.ControlSocket)
}

// takesPeers reports whether the engine listens on its control socket.
func (r *Reloader) takesPeers() bool {
	p := r.controlPath()
	if p == "" {
		return false
	}
	if _, err := os.Stat(p); err != nil {
		return false
	}
	return ProbeSocket(p) == SocketLive
}

func (r *Reloader) controlClient() *http.Client {
	if r.control == nil {
		path := r.controlPath()
		r.control = &http.Client{
			Timeout: pushTimeout,
			Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "unix", path)
				},
				// A connection kept from before a reload is served by an
				// old worker, whose lua state predates the reload and knows
				// no route it added: the push after a reload got 404 and
				// forced a second reload (measured). A unix connect costs
				// microseconds; every push takes a new one.
				DisableKeepAlives: true,
			},
		}
	}
	return r.control
}

// nextSerial is a push serial larger than every earlier one of this
// sidecar and, through the clock, of an earlier sidecar of this pod.
func (r *Reloader) nextSerial() int64 {
	s := max(r.now().UnixMilli(), r.serial+1)
	r.serial = s
	return s
}

// push sends one table to the engine and returns the version it accepted.
// An engine holding a higher serial (pushed by this pod's previous sidecar,
// whose serials ran ahead of the clock) refuses with 409 and names it: the
// push is retried once above it.
func (r *Reloader) push(ctx context.Context, content []byte) (peers.Table, error) {
	t, err := peers.Parse(content)
	if err != nil {
		return t, err
	}
	var stored int64
	err = r.pushOnce(ctx, t, content, &stored)
	// Right after a reload a worker of the old generation may still take
	// the connection (it closes its listeners only when it gets to its
	// shutdown), and its lua state predates the reload's new routes
	// (measured: a 404 9 ms after the new workers were seen). Ask again
	// for a moment before concluding the engine lacks the route.
	for i := 0; errors.Is(err, errNoRoute) && i < noRouteRetries && r.now().Sub(r.reloadedAt) < noRouteWindow; i++ {
		select {
		case <-ctx.Done():
			return t, err
		case <-time.After(noRouteBackoff):
		}
		err = r.pushOnce(ctx, t, content, &stored)
	}
	if !errors.Is(err, errOlderSerial) {
		return t, err
	}
	r.serial = max(r.serial, stored)
	return t, r.pushOnce(ctx, t, content, nil)
}

// A push answered 404 within noRouteWindow of a reload is retried every
// noRouteBackoff, noRouteRetries times at most.
const (
	noRouteWindow  = 5 * time.Second
	noRouteBackoff = 20 * time.Millisecond
	noRouteRetries = 25
)

// errOlderSerial: the engine holds a table with a higher serial.
var errOlderSerial = errors.New("the engine holds a newer serial")

func (r *Reloader) pushOnce(ctx context.Context, t peers.Table, content []byte, stored *int64) error {
	ctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://engine/peers/"+url.PathEscape(t.Route), bytes.NewReader(content))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(peers.SerialHeader, strconv.FormatInt(r.nextSerial(), 10))
	resp, err := r.controlClient().Do(req)
	if err != nil {
		return fmt.Errorf("push %s: %w", t.Route, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var a pushAnswer
	_ = json.Unmarshal(body, &a)
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("push %s: %w", t.Route, errNoRoute)
	case resp.StatusCode == http.StatusConflict && stored != nil && a.Serial > 0:
		*stored = a.Serial
		return errOlderSerial
	case resp.StatusCode != http.StatusOK:
		msg := a.Error
		if msg == "" {
			msg = string(bytes.TrimSpace(body))
		}
		return fmt.Errorf("push %s: %w (%s): %s", t.Route, errRefused, resp.Status, msg)
	case a.Version != t.Version:
		return fmt.Errorf("push %s: %w: it acknowledged version %q, not %q", t.Route, errRefused, a.Version, t.Version)
	}
	return nil
}

// readKey reads key from the first watched directory holding it and
// checks it is the content the snapshot saw (sum).
func (r *Reloader) readKey(key, sum string) ([]byte, error) {
	for _, d := range r.dirs {
		b, err := os.ReadFile(filepath.Join(d, key))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		s := sha256.Sum256(b)
		if sum != "" && hex.EncodeToString(s[:]) != sum {
			return nil, errContentMoved
		}
		return b, nil
	}
	return nil, fmt.Errorf("%s: %w", key, os.ErrNotExist)
}

var errContentMoved = errors.New("the content changed while it was read")

// onlyPeersChanged reports whether every key that differs between loaded
// and now is a peers table present in now (a removed table goes with a
// route file change, which reloads).
func onlyPeersChanged(loaded, now map[string]string) (changed []string, ok bool) {
	for k, v := range now {
		if loaded[k] != v {
			if !peers.IsKey(k) {
				return nil, false
			}
			changed = append(changed, k)
		}
	}
	for k := range loaded {
		if _, in := now[k]; !in {
			return nil, false
		}
	}
	slices.Sort(changed)
	return changed, true
}

// pushKeys pushes keys of snap and returns the keys served now: loaded
// with every accepted key's new hash. It fails with errNoRoute when the
// engine lacks a route (a reload is due) and errContentMoved when the
// directories moved.
func (r *Reloader) pushKeys(ctx context.Context, snap Snapshot, keys []string) (servedKeys map[string]string, refused []string, err error) {
	servedKeys = maps.Clone(r.loadedKeys)
	if servedKeys == nil {
		servedKeys = map[string]string{}
	}
	for _, k := range keys {
		start := r.now()
		b, rerr := r.readKey(k, snap.Keys[k])
		if errors.Is(rerr, errContentMoved) {
			return servedKeys, refused, rerr
		}
		var t peers.Table
		if rerr == nil {
			t, rerr = r.push(ctx, b)
		}
		r.metrics.PushDuration.Observe(r.now().Sub(start).Seconds())
		switch {
		case rerr == nil:
			r.metrics.Pushes.WithLabelValues(PushAccepted).Inc()
			servedKeys[k] = snap.Keys[k]
			r.accepted[t.Route] = t.Version
			r.log.Debug("peers pushed", "key", k, "route", t.Route, "version", t.Version, "peers", t.Peers(), "elapsed", r.now().Sub(start).Round(time.Microsecond))
		case errors.Is(rerr, errNoRoute):
			r.metrics.Pushes.WithLabelValues(PushNoRoute).Inc()
			return servedKeys, refused, rerr
		default:
			res := PushError
			if errors.Is(rerr, errRefused) {
				res = PushRefused
			}
			r.metrics.Pushes.WithLabelValues(res).Inc()
			r.log.Error("peers table not taken; the engine keeps picking from its last good table; retried at the next change or resync", "key", k, "result", res, "err", rerr)
			refused = append(refused, k)
		}
	}
	return servedKeys, refused, nil
}

// peersKeys are the peers tables of snap, sorted.
func peersKeys(keys map[string]string) []string {
	var out []string
	for k := range keys {
		if peers.IsKey(k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// pushAll pushes every table of snap (after a reload, or to a new master).
// ok is false when a table could not be pushed.
func (r *Reloader) pushAll(ctx context.Context, snap Snapshot) (servedKeys map[string]string, ok bool) {
	keys := peersKeys(snap.Keys)
	if len(keys) == 0 || !r.takesPeers() {
		return nil, true
	}
	servedKeys, refused, err := r.pushKeys(ctx, snap, keys)
	if err != nil {
		r.log.Error("peers tables not pushed; retrying", "err", err)
		return servedKeys, false
	}
	return servedKeys, len(refused) == 0
}

// pushFor brings a peers-only change to the engine. It returns nextDone
// when every table was accepted (or refused by the engine: retried at the
// resync), and ok false when a reload must come first.
func (r *Reloader) pushFor(ctx context.Context, snap Snapshot, keys []string) (next, bool) {
	start := r.now()
	servedKeys, refused, err := r.pushKeys(ctx, snap, keys)
	switch {
	case errors.Is(err, errContentMoved):
		return nextSettle, true
	case errors.Is(err, errNoRoute):
		r.log.Info("the engine does not know a route of this change yet; reloading")
		return nextDone, false
	}
	r.loadedKeys = servedKeys
	if len(refused) == 0 {
		r.loaded = snap.Fingerprint
	}
	r.log.Info("peers pushed: no reload", "keys", len(keys), "refused", refused, "elapsed", r.now().Sub(start).Round(time.Microsecond), "content", shortFP(snap.Fingerprint))
	if r.report != nil {
		r.report(r.servedReportKeys(servedKeys, served.HowPush))
	}
	if r.onPush != nil {
		r.onPush(keys, refused)
	}
	if len(refused) > 0 {
		return nextResync, true
	}
	return nextDone, true
}

// servedReportKeys is the report of what the engine serves: keys by their
// full hash, and the peers versions it acknowledged.
func (r *Reloader) servedReportKeys(keys map[string]string, how string) served.Report {
	rep := servedReport(Snapshot{Keys: keys}, how, r.now())
	if len(r.accepted) > 0 {
		rep.Peers = maps.Clone(r.accepted)
	}
	return rep
}

// repushAll pushes every table the target serves to a new master (or at
// start, once the engine listens). It stays due until it succeeds.
func (r *Reloader) repushAll(ctx context.Context) {
	if !r.takesPeers() {
		return
	}
	snap, err := r.snapshot(r.dirs)
	if err != nil {
		return
	}
	var keys []string
	for _, k := range peersKeys(snap.Keys) {
		if r.loadedKeys[k] == snap.Keys[k] {
			keys = append(keys, k)
		}
	}
	_, refused, err := r.pushKeys(ctx, snap, keys)
	if err != nil || len(refused) > 0 {
		r.log.Info("peers tables not all pushed to the engine; retrying at the next sweep", "err", err, "refused", refused)
		return
	}
	r.repush = false
	r.log.Info("peers tables pushed to the engine", "tables", len(keys))
}

// peersOnlyDesired reports, in API mode with the engine on its control
// socket, whether the desired content differs from what is applied in
// peers tables only (changed, never added or removed).
func (r *Reloader) peersOnlyDesired() bool {
	if r.source == nil || r.opts.SockDir == "" {
		return false
	}
	desired, _, ok := r.source.Desired()
	if !ok || len(desired) != len(r.applied) {
		return false
	}
	changed := changedKeys(r.applied, desired)
	if len(changed) == 0 {
		return false
	}
	for _, k := range changed {
		if _, in := r.applied[k]; !in || !peers.IsKey(k) {
			return false
		}
	}
	return r.takesPeers()
}
