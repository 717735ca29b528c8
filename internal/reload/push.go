package reload

// This file: dynamic peers. When the engine listens on its control socket
// (<sock-dir>/autoconfig@control.sock, internal/peers), a change that
// touches only peers tables (peers_<route>.json) is pushed into the
// running engine instead of reloading it: no check, no signal, no new
// worker generation. Every other change still goes check → signal, and
// after it every table is pushed again (a new route's dict exists only
// after the reload). A new target master gets every table too.
//
// A table is checked before it is pushed (peers.ParseFile: the engine's
// rules, and the route its key names). A table the engine does not take
// keeps a verdict (unserved) until its content changes: one refused before
// the push is not pushed again; one for a route the engine lacks costs at
// most one reload per content of the route files, then waits for its route
// (pushed again after every reload and at resync ticks 1, 2, 4, … after,
// up to noRouteMaxWait); one the engine refused is pushed again at every
// resync. Each is logged when its verdict changes, not at every retry.

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
	PushRefused  = "refused"  // the engine refused the table (dict full, older serial, its own check)
	PushInvalid  = "invalid"  // refused before any push: it fails the engine's rules (peers.Check), does not parse, or its route is not its key's
	PushNoRoute  = "no_route" // the engine has no such route (404)
	PushError    = "error"    // no answer, an unreadable file
)

// noRouteMaxWait bounds the wait between two pushes of a table waiting for
// its route (the wait doubles from --resync).
const noRouteMaxWait = 10 * time.Minute

// unserved is a table whose content on disk the engine does not hold, and
// why: the verdict of its last push, for the content it was made on.
type unserved struct {
	sum    string // the file's sum (Snapshot.Keys) the verdict is for
	result string // PushInvalid, PushRefused, PushNoRoute or PushError
	// waiting: no_route although the target reloaded the route files on
	// disk, so a reload cannot help. Pushed again after every reload and
	// from resync tick due on; every (in ticks) doubles at each miss.
	waiting    bool
	due, every int64
}

// pushed is what one pushKeys did.
type pushed struct {
	served   map[string]string // the keys served now: serving.keys with each accepted key's new sum
	tried    []string          // keys pushed or refused before the push
	accepted []string
	held     []string // not taken: the engine keeps its last table of these (or none)
	reload   []string // no_route on route files the target has not reloaded: a reload may bring the route
}

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

// pusher brings a change of peers tables only into the running engine
// over its control socket (trigger), pushes every table again after a
// reload and to a new master, and keeps each table's verdict.
type pusher struct {
	*env
	path   string        // the engine's control socket ("" without --sock-dir)
	resync time.Duration // --resync: the clock of a table waiting for its route
	// onPush, nil outside tests, is called after each peers-only change
	// was pushed, with the keys tried and those not taken (refused,
	// waiting for their route).
	onPush func(keys, refused []string)

	// State, owned by Run's goroutine.
	control  *http.Client        // to the engine's control socket
	serial   int64               // last push serial
	unserved map[string]unserved // peers key → why the engine does not hold its content on disk
	ticks    int64               // resync ticks so far: the clock of a table waiting for its route
	repush   bool                // a new target master (or the start): push every table again
	// reloadedAt is the last verified reload (the old workers may still
	// accept for a moment); reloadedConf identifies its route files
	// (routeFilesID): a route the engine lacks after it is not added by
	// another reload of the same files.
	reloadedAt   time.Time
	reloadedConf string
}

var _ trigger = (*pusher)(nil)

// newPusher is the pusher of the engine listening in sockDir ("" = none).
func newPusher(e *env, sockDir string, resync time.Duration) *pusher {
	p := &pusher{env: e, resync: resync, unserved: map[string]unserved{}}
	if sockDir != "" {
		p.path = filepath.Join(sockDir, peers.ControlSocket)
	}
	return p
}

// start takes the tables of snap, the content present at start, as what
// the engine serves: the engine may have started with an older table
// than the files show (or none), so they are all pushed once it listens.
func (p *pusher) start(snap Snapshot) {
	p.repush = len(peersKeys(snap.Keys)) > 0
}

// tick counts a resync tick.
func (p *pusher) tick() { p.ticks++ }

// newMaster records that the target's master changed (pid 0: none is
// left): a new one gets every table, and a table waiting for its route
// is pushed at the next resync, since the new master read the route
// files afresh.
func (p *pusher) newMaster(pid int) {
	p.repush = p.repush || pid != 0
	for k, u := range p.unserved {
		if u.waiting {
			u.due = p.ticks
			p.unserved[k] = u
		}
	}
}

// reloaded records a verified reload of snap's route files.
func (p *pusher) reloaded(snap Snapshot) {
	p.reloadedAt = p.now()
	p.reloadedConf = routeFilesID(snap.Keys)
}

// listening reports whether the engine listens on its control socket.
func (p *pusher) listening() bool {
	if p.path == "" {
		return false
	}
	if _, err := os.Stat(p.path); err != nil {
		return false
	}
	return ProbeSocket(p.path) == SocketLive
}

func (p *pusher) controlClient() *http.Client {
	if p.control == nil {
		path := p.path
		p.control = &http.Client{
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
	return p.control
}

// nextSerial is a push serial larger than every earlier one of this
// sidecar and, through the clock, of an earlier sidecar of this pod.
func (p *pusher) nextSerial() int64 {
	s := max(p.now().UnixMilli(), p.serial+1)
	p.serial = s
	return s
}

// push sends one checked table to the engine and checks it acknowledged
// the table's version. An engine holding a higher serial (pushed by this
// pod's previous sidecar, whose serials ran ahead of the clock) refuses
// with 409 and names it: the push is retried once above it.
func (p *pusher) push(ctx context.Context, t peers.Table, content []byte) error {
	var stored int64
	err := p.pushOnce(ctx, t, content, &stored)
	// Right after a reload a worker of the old generation may still take
	// the connection (it closes its listeners only when it gets to its
	// shutdown), and its lua state predates the reload's new routes
	// (measured: a 404 9 ms after the new workers were seen). Ask again
	// for a moment before concluding the engine lacks the route.
	for i := 0; errors.Is(err, errNoRoute) && i < noRouteRetries && p.now().Sub(p.reloadedAt) < noRouteWindow; i++ {
		select {
		case <-ctx.Done():
			return err
		case <-time.After(noRouteBackoff):
		}
		err = p.pushOnce(ctx, t, content, &stored)
	}
	if !errors.Is(err, errOlderSerial) {
		return err
	}
	p.serial = max(p.serial, stored)
	return p.pushOnce(ctx, t, content, nil)
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

func (p *pusher) pushOnce(ctx context.Context, t peers.Table, content []byte, stored *int64) error {
	ctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://engine/peers/"+url.PathEscape(t.Route), bytes.NewReader(content))
	if err != nil {
		return err
	}
	serial := p.nextSerial()
	if serial > peers.MaxSerial {
		return fmt.Errorf("push %s: %w: its serial would be %d, above 2^53, the greatest an engine takes (the engine holds a serial pushed from a clock far ahead): restart the engine to clear it", t.Route, errRefused, serial)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(peers.SerialHeader, strconv.FormatInt(serial, 10))
	resp, err := p.controlClient().Do(req)
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
func (p *pusher) readKey(key, sum string) ([]byte, error) {
	for _, d := range p.dirs {
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

// pushKeys pushes keys of snap, except a table whose verdict stands on
// the same content: one refused before the push (invalid), and one
// waiting for its route until its next push is due (unless all, after a
// reload or to a new master). It fails only with errContentMoved (the
// directories moved: nothing more is pushed).
func (p *pusher) pushKeys(ctx context.Context, snap Snapshot, sv *serving, keys []string, all bool) (pushed, error) {
	out := pushed{served: maps.Clone(sv.keys)}
	if out.served == nil {
		out.served = map[string]string{}
	}
	conf := routeFilesID(snap.Keys)
	for _, k := range keys {
		sum := snap.Keys[k]
		u, known := p.unserved[k]
		if known && u.sum == sum && (u.result == PushInvalid || u.waiting && !all && p.ticks < u.due) {
			out.held = append(out.held, k)
			continue
		}
		start := p.now()
		b, err := p.readKey(k, sum)
		if errors.Is(err, errContentMoved) {
			return out, err
		}
		res := PushError
		var t peers.Table
		if err == nil {
			if t, err = peers.ParseFile(k, b); err != nil {
				res = PushInvalid
			} else {
				err = p.push(ctx, t, b)
				res = pushResult(err)
				p.metrics.PushDuration.Observe(p.now().Sub(start).Seconds())
			}
		}
		p.metrics.Pushes.WithLabelValues(res).Inc()
		out.tried = append(out.tried, k)
		v := unserved{sum: sum, result: res}
		switch {
		case res == PushAccepted:
			out.served[k] = sum
			out.accepted = append(out.accepted, k)
			sv.peers[t.Route] = t.Version
			if known {
				p.log.Info("peers table taken: the engine serves its current version", "key", k, "route", t.Route, "version", t.Version, "before", u.result)
				delete(p.unserved, k)
			}
			p.log.Debug("peers pushed", "key", k, "route", t.Route, "version", t.Version, "peers", t.Peers(), "elapsed", p.now().Sub(start).Round(time.Microsecond))
			continue
		case res == PushNoRoute && conf != p.reloadedConf:
			// The target has not loaded these route files since this
			// sidecar started (or not at all): a reload may add the route.
			out.reload = append(out.reload, k)
			p.log.Debug("the engine has no route for this table; a reload of the route files on disk may bring it", "key", k, "route", t.Route)
		case res == PushNoRoute:
			v.waiting, v.every = true, 1
			if known && u.waiting {
				v.every = min(2*u.every, max(1, int64(noRouteMaxWait/p.resync)))
			}
			v.due = p.ticks + v.every
			if !known || !u.waiting {
				p.log.Error("peers table waits for its route: the engine has no such route although it loaded the route files on disk (is the route file missing, quarantined or refused by the check?); not reloading for it again; pushed again after the next reload, and at resync ticks with a backoff doubling up to "+noRouteMaxWait.String(),
					"key", k, "route", t.Route, "err", err)
			} else {
				p.log.Debug("peers table still waits for its route", "key", k, "route", t.Route, "next in resyncs", v.every)
			}
		case known && u.result == res && u.sum == sum:
			// The same verdict on the same content: logged already.
			p.log.Debug("peers table still not taken", "key", k, "result", res, "err", err)
		case res == PushInvalid:
			p.log.Error("peers table refused before pushing: the engine would not take it, or it names another route than its key; the engine keeps its last good table of the route; pushed again when the file changes",
				"key", k, "err", err)
		default:
			p.log.Error("peers table not taken; the engine keeps picking from its last good table; retried at the next change or resync", "key", k, "result", res, "err", err)
		}
		p.unserved[k] = v
		if v.result != PushNoRoute || v.waiting {
			out.held = append(out.held, k)
		}
	}
	return out, nil
}

// pushResult is the peers_pushes_total result of a push's error.
func pushResult(err error) string {
	switch {
	case err == nil:
		return PushAccepted
	case errors.Is(err, errNoRoute):
		return PushNoRoute
	case errors.Is(err, errRefused):
		return PushRefused
	default:
		return PushError
	}
}

// keepUnserved forgets the verdicts of tables no longer in keys and sets
// the peers_tables_unserved gauge.
func (p *pusher) keepUnserved(keys map[string]string) {
	n := map[string]int{}
	for k, u := range p.unserved {
		if _, ok := keys[k]; !ok {
			delete(p.unserved, k)
			continue
		}
		n[u.result]++
	}
	for _, res := range []string{PushInvalid, PushNoRoute, PushRefused, PushError} {
		p.metrics.PeersUnserved.WithLabelValues(res).Set(float64(n[res]))
	}
}

// routeFilesID identifies the keys that are no peers table (the files
// nginx loads) by name and content.
func routeFilesID(keys map[string]string) string {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if peers.IsKey(k) {
			continue
		}
		h.Write([]byte(k))
		h.Write([]byte{0})
		h.Write([]byte(keys[k]))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
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

// pushAll pushes every table of snap (after a reload), also those waiting
// for their route. ok is false when a table is not served.
func (p *pusher) pushAll(ctx context.Context, snap Snapshot, sv *serving) (servedKeys map[string]string, ok bool) {
	keys := peersKeys(snap.Keys)
	if len(keys) == 0 || !p.listening() {
		return nil, true
	}
	out, err := p.pushKeys(ctx, snap, sv, keys, true)
	p.keepUnserved(snap.Keys)
	if err != nil {
		p.log.Info("the directories changed while their peers tables were pushed; looking again", "err", err)
		return out.served, false
	}
	return out.served, len(out.held)+len(out.reload) == 0
}

// fire implements trigger: it takes a change of only peers tables while
// the engine listens, and brings it to the engine. It returns nextDone
// when every table was accepted, nextResync when one was not (its verdict
// says when it is pushed again), and taken false when a reload must come
// first: the engine lacks a route and has not loaded the route files on
// disk since this sidecar started.
func (p *pusher) fire(ctx context.Context, snap Snapshot, sv *serving) (next, bool) {
	keys, ok := onlyPeersChanged(sv.keys, snap.Keys)
	if !ok || len(keys) == 0 || !p.listening() {
		return nextDone, false
	}
	start := p.now()
	out, err := p.pushKeys(ctx, snap, sv, keys, false)
	if err != nil {
		return nextSettle, true
	}
	if len(out.reload) > 0 {
		p.log.Info("the engine does not know the route of these peers tables; reloading once (if the reloaded route files do not add it, the tables wait for their route without more reloads)", "keys", out.reload)
		return nextDone, false
	}
	sv.keys = out.served
	if len(out.held) == 0 {
		sv.loaded = snap.Fingerprint
	}
	p.keepUnserved(snap.Keys)
	if len(out.accepted) > 0 {
		p.log.Info("peers pushed: no reload", "keys", len(out.accepted), "not taken", out.held, "elapsed", p.now().Sub(start).Round(time.Microsecond), "content", shortFP(snap.Fingerprint))
		if p.report != nil {
			p.report(sv.report(served.HowPush, p.now()))
		}
	} else {
		p.log.Debug("no peers table taken", "not taken", out.held)
	}
	if p.onPush != nil && len(out.tried) > 0 {
		p.onPush(out.tried, out.held)
	}
	if len(out.held) > 0 {
		return nextResync, true
	}
	return nextDone, true
}

// repushAll pushes every table the target serves to a new master (or at
// start, once the engine listens), if one is due. It stays due while a
// push gets no answer; a table the engine does not take is no longer
// counted as served, and the next resync treats it as a change (with its
// verdict).
func (p *pusher) repushAll(ctx context.Context, sv *serving) {
	if !p.repush || !p.listening() {
		return
	}
	snap, err := p.snapshot(p.dirs)
	if err != nil {
		return
	}
	var keys []string
	for _, k := range peersKeys(snap.Keys) {
		if sv.keys[k] == snap.Keys[k] {
			keys = append(keys, k)
		}
	}
	out, err := p.pushKeys(ctx, snap, sv, keys, true)
	if err != nil {
		p.log.Info("the directories changed while the peers tables were pushed to the engine; retrying at the next sweep", "err", err)
		return
	}
	retry := false
	var dropped []string
	for _, k := range append(out.held, out.reload...) {
		if p.unserved[k].result == PushError {
			retry = true
			continue
		}
		delete(sv.keys, k)
		dropped = append(dropped, k)
	}
	p.keepUnserved(snap.Keys)
	if len(dropped) > 0 {
		sv.loaded = ""
		if p.report != nil {
			p.report(sv.report(served.HowPush, p.now()))
		}
	}
	if retry {
		p.log.Debug("peers tables not all pushed to the engine; retrying at the next sweep", "tables", len(keys))
		return
	}
	p.repush = false
	p.log.Info("peers tables pushed to the engine", "tables", len(out.accepted), "not taken", dropped)
}
