package reload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os/exec"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/modelsphere/autoconfig/internal/served"
)

// Signaller delivers a signal to a process.
type Signaller interface {
	Signal(pid int, sig syscall.Signal) error
}

// KillSignaller signals with kill(2).
type KillSignaller struct{}

var _ Signaller = KillSignaller{}

// Signal implements Signaller.
func (KillSignaller) Signal(pid int, sig syscall.Signal) error { return syscall.Kill(pid, sig) }

// Outcome reports one reload attempt.
type Outcome struct {
	Result  string
	PID     int
	Err     error
	Started time.Time     // when the settled change was acted on
	Elapsed time.Duration // until the result was known
	// Fingerprint of the directories' content this attempt was for.
	Fingerprint string
	// Keys are the watched files the failing check's output names
	// (check_failed only).
	Keys []string
	// Quarantined are, in API mode, the keys whose refused new version is
	// held back (their last good version is on disk).
	Quarantined []string
}

// Reloader turns settled changes of the watched directories into
// validated, verified signals to the target process. Build it with New
// and start it with Run; everything in it is private: its configuration
// is New's resolved copy of the Options, the rest is state owned by Run.
type Reloader struct {
	// opts is the caller's Options with the defaults filled in (New).
	opts     Options
	dirs     []string       // watched and fingerprinted: --watch, plus --write-dir in API mode
	checkCmd []string       // --check-cmd split, nil = no check
	signal   syscall.Signal // --signal parsed
	log      *slog.Logger
	metrics  *Metrics

	// source, in API mode, supplies the content written into writeDir
	// (which is one of dirs). Nil in mounted mode.
	source   Source
	writeDir string
	cmSync   *ConfigMapSync // the source New built from --configmap; Run runs it
	// report, if set, is given what the target serves: the content
	// present at start, then each content it was seen to load
	// (served.go). It must not block.
	report   func(served.Report)
	reporter *PodReporter // the report New built from --pod-name; Run runs it

	// Seams: New sets the real ones; only tests replace them.
	self       int       // our pid, never matched
	signaller  Signaller // kill(2)
	now        func() time.Time
	writeFiles func(dir string, files map[string][]byte, now time.Time) (bool, error) // WriteAtomic
	snapshot   func(dirs []string) (Snapshot, error)                                  // TakeSnapshot

	// Observers, nil outside tests (testhooks.go): after every attempt;
	// after each peers-only change was pushed, with the keys tried and
	// those not taken (refused, waiting for their route); each time the directories were looked at,
	// with whether their visible content is new.
	onReload func(Outcome)
	onPush   func(keys, refused []string)
	onSettle func(changed bool)

	ran     atomic.Bool
	started chan struct{} // closed once the watches are in place

	// State, owned by Run's goroutine.
	lastPID    int               // target seen by the last socket sweep (0 = none)
	loaded     string            // fingerprint of the content the target last loaded
	checked    string            // fingerprint of a content that passed the check
	seen       string            // fingerprint last counted as a change
	applied    map[string][]byte // API mode: the accepted content writeDir shows
	appliedFor string            // API mode: version of the desired content applied
	refusedFor string            // API mode: version whose check failed even without its changes
	quarantine map[string]quarantined
	loadedKeys map[string]string   // hash of each key the target serves (Snapshot.Keys)
	accepted   map[string]string   // route → peers version the engine acknowledged
	unserved   map[string]unserved // peers key → why the engine does not hold its content on disk (push.go)
	reloadedAt time.Time           // last verified reload (the old workers may still accept for a moment)
	// reloadedConf identifies the route files of the last verified reload
	// (routeFilesID): a route the engine lacks after it is not added by
	// another reload of the same files.
	reloadedConf string
	ticks        int64        // resync ticks so far: the clock of a table waiting for its route
	repush       bool         // a new target master: push every table again
	serial       int64        // last push serial
	control      *http.Client // to the engine's control socket
}

// retryMin is the first retry delay after an error; it doubles up to
// RetryMax.
const retryMin = 500 * time.Millisecond

// next is what the loop does after an attempt.
type next int

const (
	nextDone   next = iota // the target serves what the directories show, or nothing changed
	nextSettle             // the content moved during the attempt: settle and look again
	nextRetry              // an error: retry with backoff, even without a change
	nextResync             // a verdict on this content (check failed, reload refused): retried at the resync tick or on a change
)

// watch is the loop: it watches the directories until ctx is done. The
// content present at start is taken as already loaded by the target: only
// later changes reload.
func (r *Reloader) watch(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("start watcher: %w", err)
	}
	defer w.Close()
	for _, d := range r.dirs {
		if err := w.Add(d); err != nil {
			return fmt.Errorf("watch %s: %w", d, err)
		}
	}
	snap, err := r.snapshot(r.dirs)
	if err != nil {
		return fmt.Errorf("read watched directories: %w", err)
	}
	r.loaded, r.seen = snap.Fingerprint, snap.Fingerprint
	r.loadedKeys, r.accepted, r.unserved = snap.Keys, map[string]string{}, map[string]unserved{}
	// The engine may have started with an older table than the files
	// show (or none): push them all once it listens.
	r.repush = len(peersKeys(snap.Keys)) > 0
	if r.report != nil {
		r.report(servedReport(snap, served.HowStart, r.now()))
	}
	var changes <-chan struct{}
	if r.source != nil {
		if r.applied, err = readFiles(r.writeDir); err != nil {
			return fmt.Errorf("read --write-dir: %w", err)
		}
		changes = r.source.Changed()
	}
	r.log.Info("watching", "dirs", r.dirs, "process", r.opts.Process, "debounce", r.opts.Debounce, "maxDelay", r.opts.MaxDelay, "resync", r.opts.Resync)
	close(r.started)

	timer := time.NewTimer(r.opts.Debounce)
	timer.Stop()
	defer timer.Stop()
	// pending is when the first event not yet acted on was seen: the
	// debounce restarts on every event, but never beyond pending+MaxDelay.
	var pending time.Time
	settle := func() {
		now := time.Now()
		if pending.IsZero() {
			pending = now
		}
		timer.Reset(max(0, min(r.opts.Debounce, pending.Add(r.opts.MaxDelay).Sub(now))))
	}
	var backoff time.Duration
	force := false
	resync := time.NewTicker(r.opts.Resync)
	defer resync.Stop()
	var sweep <-chan time.Time
	if r.opts.SockDir != "" {
		t := time.NewTicker(r.opts.SockSweep)
		defer t.Stop()
		sweep = t.C
		r.lastPID = r.targetPID()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sweep:
			// A master that crashed leaves its sockets behind, and the
			// restarted one retries bind() only for about 2.5 s before
			// giving up: clean as soon as the target is gone or replaced.
			if pid := r.targetPID(); pid != r.lastPID || pid == 0 {
				if pid != r.lastPID {
					r.log.Info("target process changed; checking sockets", "old", r.lastPID, "new", pid)
					r.repush = r.repush || pid != 0
					// A new master read the route files afresh: a table
					// waiting for its route is pushed at the next resync.
					for k, u := range r.unserved {
						if u.waiting {
							u.due = r.ticks
							r.unserved[k] = u
						}
					}
				}
				r.lastPID = pid
				r.cleanSockets()
			}
			if r.repush && r.lastPID != 0 {
				r.repushAll(ctx)
			}
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("watcher closed")
			}
			r.log.Debug("fs event", "name", ev.Name, "op", ev.Op.String())
			settle()
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("watcher closed")
			}
			// An overflow loses events: look at the directories anyway.
			r.log.Warn("watch error; rescanning", "err", err)
			settle()
		case <-changes:
			r.log.Debug("configmap content changed")
			if r.peersOnlyDesired() {
				// Only peers tables: a push costs a millisecond and
				// needs no check, so it does not wait for quiet.
				if pending.IsZero() {
					pending = time.Now()
				}
				timer.Reset(0)
				continue
			}
			settle()
		case <-resync.C:
			// A lost event, a refused content worth another try, a
			// quarantined key that may pass now: look again.
			r.ticks++
			force = true
			if pending.IsZero() {
				timer.Reset(0)
			}
		case <-timer.C:
			if swapInProgress(r.dirs) {
				// A kubelet swap takes a millisecond or two: look again
				// soon, even past MaxDelay.
				r.log.Debug("..data_tmp present: swap in progress, waiting")
				timer.Reset(min(r.opts.Debounce, 10*time.Millisecond))
				continue
			}
			first := pending
			pending = time.Time{}
			n := r.attempt(ctx, force)
			force = false
			switch n {
			case nextDone, nextResync:
				backoff = 0
			case nextSettle:
				// The content moved under the check. It has waited its
				// debounce already: look again at once (or when the
				// first wait would have ended), not after another
				// max-delay, or a steady writer could starve it.
				if first.IsZero() {
					first = time.Now()
				}
				pending = first
				timer.Reset(max(0, min(r.opts.Debounce, pending.Add(r.opts.MaxDelay).Sub(time.Now()))))
			case nextRetry:
				backoff = min(max(2*backoff, retryMin), r.opts.RetryMax)
				r.log.Info("retrying", "in", backoff)
				timer.Reset(backoff)
			}
		}
	}
}

// attempt brings the target to the content the directories show (in API
// mode after writing the desired content there).
func (r *Reloader) attempt(ctx context.Context, force bool) next {
	if r.source != nil {
		if n := r.apply(ctx, force); n != nextDone {
			return n
		}
	}
	snap, err := r.snapshot(r.dirs)
	if err != nil {
		r.metrics.Reloads.WithLabelValues(ResultError).Inc()
		r.log.Error("cannot read the watched directories; retrying", "err", err)
		return nextRetry
	}
	r.keepUnserved(snap.Keys)
	if snap.Fingerprint == r.loaded {
		r.log.Debug("the target already serves this content; not reloading")
		if r.onSettle != nil {
			r.onSettle(false)
		}
		return nextDone
	}
	if snap.Fingerprint != r.seen {
		r.seen = snap.Fingerprint
		r.metrics.Changes.Inc()
		if r.onSettle != nil {
			r.onSettle(true)
		}
	}
	// Only peers tables changed, and the engine takes them: push, no
	// reload (push.go).
	if changed, ok := onlyPeersChanged(r.loadedKeys, snap.Keys); ok && len(changed) > 0 && r.takesPeers() {
		if n, pushed := r.pushFor(ctx, snap, changed); pushed {
			return n
		}
	}
	o := r.reloadFor(ctx, snap)
	switch o.Result {
	case ResultSuccess, ResultSignalled:
		// The reloaded engine keeps picking from the tables it holds
		// until they are pushed: they count as served once accepted (a
		// new one not before).
		keys := maps.Clone(snap.Keys)
		for _, k := range peersKeys(keys) {
			if old, ok := r.loadedKeys[k]; ok {
				keys[k] = old
			} else {
				delete(keys, k)
			}
		}
		r.loadedKeys = keys
		r.loaded = snap.Fingerprint
		r.reloadedAt = r.now()
		r.reloadedConf = routeFilesID(snap.Keys)
		if sk, ok := r.pushAll(ctx, snap); sk != nil {
			r.loadedKeys = sk
			if !ok {
				r.loaded = ""
			}
		} else {
			r.loadedKeys = snap.Keys
		}
		if r.report != nil {
			how := served.HowReload
			if o.Result == ResultSignalled {
				how = served.HowSignal
			}
			r.report(r.servedReportKeys(r.loadedKeys, how))
		}
		return nextDone
	case ResultContentChanged:
		return nextSettle
	case ResultCheckFailed, ResultFailed:
		return nextResync
	default:
		return nextRetry
	}
}

func (r *Reloader) reloadFor(ctx context.Context, snap Snapshot) Outcome {
	start := r.now()
	o := r.reload(ctx, snap)
	o.Started, o.Elapsed, o.Fingerprint = start, r.now().Sub(start), snap.Fingerprint
	o.Quarantined = r.quarantinedKeys()
	r.metrics.Reloads.WithLabelValues(o.Result).Inc()
	r.metrics.LastAttempt.Set(float64(r.now().Unix()))
	if o.Result == ResultSuccess || o.Result == ResultSignalled {
		r.metrics.LastSuccess.Set(float64(r.now().Unix()))
	}
	if o.PID != 0 && o.Result != ResultContentChanged {
		r.metrics.ReloadDuration.Observe(o.Elapsed.Seconds())
	}
	log := r.log.With("result", o.Result, "pid", o.PID, "elapsed", o.Elapsed.Round(time.Millisecond), "content", shortFP(snap.Fingerprint))
	if len(o.Quarantined) > 0 {
		log = log.With("quarantined", o.Quarantined)
	}
	switch o.Result {
	case ResultSuccess:
		log.Info("reloaded: new worker processes are running")
	case ResultSignalled:
		log.Info("signalled; the target has no child processes, so the reload cannot be verified")
	case ResultFailed:
		log.Error("reload failed: worker processes did not change, the old configuration keeps serving; see the target's error log; retried at the next change or resync", "err", o.Err)
	case ResultCheckFailed:
		log.Error("configuration check failed; not signalling, the old configuration keeps serving; retried at the next change or resync", "keys", o.Keys, "err", o.Err)
	case ResultContentChanged:
		log.Info("the content changed between the check and the signal; not signalling, checking the new content")
	default:
		log.Error("not reloaded; retrying", "err", o.Err)
	}
	if r.onReload != nil {
		r.onReload(o)
	}
	return o
}

func (r *Reloader) reload(ctx context.Context, snap Snapshot) Outcome {
	procs, err := ListProcesses(r.opts.ProcRoot)
	if err != nil {
		return Outcome{Result: ResultError, Err: err}
	}
	target, err := FindTarget(procs, r.opts.Process, r.self)
	switch {
	case errors.Is(err, ErrNoProcess):
		return Outcome{Result: ResultNoProcess, Err: err}
	case errors.Is(err, ErrAmbiguousProcess):
		return Outcome{Result: ResultAmbiguous, Err: err}
	case err != nil:
		return Outcome{Result: ResultError, Err: err}
	}
	o := Outcome{PID: target.PID}

	checked := false
	if len(r.checkCmd) > 0 && snap.Fingerprint != r.checked {
		if err := r.check(ctx); err != nil {
			o.Result, o.Err, o.Keys = ResultCheckFailed, err, failingKeys(err.Error(), r.dirs)
			return o
		}
		checked = true
	}
	if r.opts.SockDir != "" {
		r.cleanSockets()
	}

	r.lastPID = target.PID
	before := Children(r.opts.ProcRoot, target.PID)
	// The check ran on the content the snapshot names only if that is
	// still what the directories show: a kubelet "..data" target is never
	// modified, so the same target means the same bytes. Taken last, right
	// before the signal.
	if id, err := ContentID(r.dirs); err != nil || id != snap.ID {
		o.Result, o.Err = ResultContentChanged, fmt.Errorf("content %q checked, %q in place now (%v)", snap.ID, id, err)
		return o
	}
	if checked {
		r.checked = snap.Fingerprint
	}
	if err := r.signaller.Signal(target.PID, r.signal); err != nil {
		o.Result, o.Err = ResultError, fmt.Errorf("signal %d: %w", target.PID, err)
		return o
	}
	// Only a HUP to a master with workers is verifiable: nginx replaces
	// every worker on a good reload and keeps them all on a bad one (it
	// logs no "reload failed" line).
	if r.signal != syscall.SIGHUP || len(before) == 0 {
		o.Result = ResultSignalled
		return o
	}
	if r.waitNewChild(ctx, target.PID, before) {
		o.Result = ResultSuccess
	} else {
		o.Result = ResultFailed
		o.Err = fmt.Errorf("children of %d still %v after %s", target.PID, before, r.opts.VerifyTimeout)
	}
	return o
}

// targetPID is the pid of the one matching process, 0 if none or several.
func (r *Reloader) targetPID() int {
	procs, err := ListProcesses(r.opts.ProcRoot)
	if err != nil {
		return 0
	}
	p, err := FindTarget(procs, r.opts.Process, r.self)
	if err != nil {
		return 0
	}
	return p.PID
}

// verifyPoll is how often the children are re-read while verifying; a
// reload takes tens to hundreds of milliseconds.
const verifyPoll = 10 * time.Millisecond

// waitNewChild waits for a child of pid that is not in before: the
// reload took. Then, still within --verify-timeout, it waits until none
// of the old children accepts connections any more (each is gone or
// shutting down, Accepting), plus one poll: nginx starts the new workers
// before it tells the old ones to quit, and until they have, a new
// connection may still reach the old configuration — the served report
// would name a content some requests do not get yet. An old child that
// never says so only delays the report to the timeout; the reload is a
// success either way.
func (r *Reloader) waitNewChild(ctx context.Context, pid int, before []int) bool {
	ctx, cancel := context.WithTimeout(ctx, r.opts.VerifyTimeout)
	defer cancel()
	t := time.NewTicker(verifyPoll)
	defer t.Stop()
	took := false
	for {
		if !took {
			for _, c := range Children(r.opts.ProcRoot, pid) {
				if !slices.Contains(before, c) {
					took = true
					break
				}
			}
		}
		if took && len(Accepting(r.opts.ProcRoot, pid, before)) == 0 {
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			return true
		}
		select {
		case <-ctx.Done():
			return took
		case <-t.C:
		}
	}
}

// maxCheckOutput bounds the check command's output kept in the log.
const maxCheckOutput = 8 << 10

func (r *Reloader) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.opts.CheckTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, r.checkCmd[0], r.checkCmd[1:]...).CombinedOutput()
	if err == nil {
		return nil
	}
	if len(out) > maxCheckOutput {
		out = append(out[:maxCheckOutput], "…"...)
	}
	return fmt.Errorf("%q: %w: %s", r.checkCmd, err, out)
}

func (r *Reloader) cleanSockets() {
	refs, err := ReferencedSockets(r.dirs)
	if err != nil {
		r.log.Warn("cannot read route files for socket references", "err", err)
	}
	acts, err := CleanSockets(r.opts.SockDir, refs)
	if err != nil {
		r.log.Warn("cannot clean the socket directory", "dir", r.opts.SockDir, "err", err)
		return
	}
	for _, a := range acts {
		switch {
		case a.Removed:
			r.metrics.StaleSockets.Inc()
			r.log.Info("removed stale socket (connect refused)", "path", a.Path, "referenced", a.Referenced)
		case a.Err != nil:
			r.log.Warn("cannot remove stale socket", "path", a.Path, "err", a.Err)
		case a.State == SocketLive && !a.Referenced:
			r.log.Debug("unreferenced socket is live; leaving it to nginx", "path", a.Path)
		}
	}
}

// shortFP abbreviates a content fingerprint for logs.
func shortFP(fp string) string {
	if len(fp) > 12 {
		return fp[:12]
	}
	return fp
}
