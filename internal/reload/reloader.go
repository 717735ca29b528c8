package reload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

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

// Reloader turns settled changes of Dirs into validated, verified signals
// to the process matching Process. Fields are read-only after Run starts.
type Reloader struct {
	Dirs         []string       // directories watched and fingerprinted
	Process      string         // --process
	SockDir      string         // --sock-dir, "" = no socket cleanup
	CheckCmd     []string       // --check-cmd argv, nil = no check
	CheckTimeout time.Duration  // bound of one check run
	Signal       syscall.Signal // default SIGHUP
	Debounce     time.Duration
	// MaxDelay bounds the wait for quiet: a change is acted on at most
	// this long after it was first seen, however many events follow.
	MaxDelay      time.Duration
	VerifyTimeout time.Duration
	// Resync is how often the content is compared with what the target
	// last loaded even without an event; it also retries a content the
	// check or the target refused.
	Resync time.Duration
	// RetryMax caps the backoff of retries after an error (no process,
	// unreadable directories, a failed write, a refused signal).
	RetryMax time.Duration
	// SockSweep is how often, with SockDir, the target's pid is checked;
	// when it changed or the target is gone, stale sockets are removed
	// without waiting for a configuration change.
	SockSweep time.Duration
	ProcRoot  string // default /proc
	Self      int    // our pid, never matched (default os.Getpid())
	Signaller Signaller
	Now       func() time.Time
	Log       *slog.Logger
	Metrics   *Metrics

	// Source, in API mode, supplies the content written into WriteDir
	// (which is one of Dirs). Nil in mounted mode.
	Source   Source
	WriteDir string
	// Write shows files in a directory (default WriteAtomic).
	Write func(dir string, files map[string][]byte, now time.Time) (bool, error)
	// Snapshot reads the watched directories (default TakeSnapshot).
	Snapshot func(dirs []string) (Snapshot, error)

	// Report, if set, is given what the target serves: the content present
	// at start, then each content it was seen to load (served.go). It
	// must not block.
	Report func(served.Report)

	// OnReload, if set, is called after every attempt (tests, benchmarks).
	OnReload func(Outcome)
	// OnPush, if set, is called after each peers-only change was pushed,
	// with the keys pushed and those the engine refused (tests, benchmarks).
	OnPush func(keys, refused []string)
	// OnSettle, if set, is called each time the directories were looked
	// at, with whether their visible content is new (tests).
	OnSettle func(changed bool)
	// Started, if set, is closed once the watches are in place.
	Started chan struct{}

	// State, owned by Run's goroutine.
	lastPID    int               // target seen by the last socket sweep (0 = none)
	loaded     string            // fingerprint of the content the target last loaded
	checked    string            // fingerprint of a content that passed the check
	seen       string            // fingerprint last counted as a change
	applied    map[string][]byte // API mode: the accepted content WriteDir shows
	appliedFor string            // API mode: version of the desired content applied
	refusedFor string            // API mode: version whose check failed even without its changes
	quarantine map[string]quarantined
	loadedKeys map[string]string // hash of each key the target serves (Snapshot.Keys)
	accepted   map[string]string // route → peers version the engine acknowledged
	repush     bool              // a new target master: push every table again
	serial     int64             // last push serial
	reloadedAt time.Time         // last verified reload (the old workers may still accept for a moment)
	control    *http.Client      // to the engine's control socket
}

// retryMin is the first retry delay after an error; it doubles up to
// RetryMax.
const retryMin = 500 * time.Millisecond

func (r *Reloader) defaults() {
	if r.Signal == 0 {
		r.Signal = syscall.SIGHUP
	}
	if r.Debounce <= 0 {
		r.Debounce = DefaultDebounce
	}
	if r.MaxDelay < r.Debounce {
		r.MaxDelay = max(DefaultMaxDelay, r.Debounce)
	}
	if r.VerifyTimeout <= 0 {
		r.VerifyTimeout = DefaultVerifyTimeout
	}
	if r.SockSweep <= 0 {
		r.SockSweep = DefaultSockSweep
	}
	if r.Resync <= 0 {
		r.Resync = DefaultResync
	}
	if r.RetryMax <= 0 {
		r.RetryMax = DefaultRetryMax
	}
	if r.CheckTimeout <= 0 {
		r.CheckTimeout = DefaultCheckTimeout
	}
	if r.ProcRoot == "" {
		r.ProcRoot = "/proc"
	}
	if r.Self == 0 {
		r.Self = os.Getpid()
	}
	if r.Signaller == nil {
		r.Signaller = KillSignaller{}
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.Log == nil {
		r.Log = slog.New(slog.DiscardHandler)
	}
	if r.Metrics == nil {
		r.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	if r.Write == nil {
		r.Write = WriteAtomic
	}
	if r.Snapshot == nil {
		r.Snapshot = TakeSnapshot
	}
}

// next is what the loop does after an attempt.
type next int

const (
	nextDone   next = iota // the target serves what the directories show, or nothing changed
	nextSettle             // the content moved during the attempt: settle and look again
	nextRetry              // an error: retry with backoff, even without a change
	nextResync             // a verdict on this content (check failed, reload refused): retried at the resync tick or on a change
)

// Run watches Dirs until ctx is done. The content present at start is taken
// as already loaded by the target: only later changes reload.
func (r *Reloader) Run(ctx context.Context) error {
	r.defaults()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("start watcher: %w", err)
	}
	defer w.Close()
	for _, d := range r.Dirs {
		if err := w.Add(d); err != nil {
			return fmt.Errorf("watch %s: %w", d, err)
		}
	}
	snap, err := r.Snapshot(r.Dirs)
	if err != nil {
		return fmt.Errorf("read watched directories: %w", err)
	}
	r.loaded, r.seen = snap.Fingerprint, snap.Fingerprint
	r.loadedKeys, r.accepted = snap.Keys, map[string]string{}
	// The engine may have started with an older table than the files
	// show (or none): push them all once it listens.
	r.repush = len(peersKeys(snap.Keys)) > 0
	if r.Report != nil {
		r.Report(servedReport(snap, served.HowStart, r.Now()))
	}
	var changes <-chan struct{}
	if r.Source != nil {
		if r.applied, err = readFiles(r.WriteDir); err != nil {
			return fmt.Errorf("read --write-dir: %w", err)
		}
		changes = r.Source.Changed()
	}
	r.Log.Info("watching", "dirs", r.Dirs, "process", r.Process, "debounce", r.Debounce, "maxDelay", r.MaxDelay, "resync", r.Resync)
	if r.Started != nil {
		close(r.Started)
	}

	timer := time.NewTimer(r.Debounce)
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
		timer.Reset(max(0, min(r.Debounce, pending.Add(r.MaxDelay).Sub(now))))
	}
	var backoff time.Duration
	force := false
	resync := time.NewTicker(r.Resync)
	defer resync.Stop()
	var sweep <-chan time.Time
	if r.SockDir != "" {
		t := time.NewTicker(r.SockSweep)
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
					r.Log.Info("target process changed; checking sockets", "old", r.lastPID, "new", pid)
					r.repush = r.repush || pid != 0
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
			r.Log.Debug("fs event", "name", ev.Name, "op", ev.Op.String())
			settle()
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("watcher closed")
			}
			// An overflow loses events: look at the directories anyway.
			r.Log.Warn("watch error; rescanning", "err", err)
			settle()
		case <-changes:
			r.Log.Debug("configmap content changed")
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
			force = true
			if pending.IsZero() {
				timer.Reset(0)
			}
		case <-timer.C:
			if swapInProgress(r.Dirs) {
				// A kubelet swap takes a millisecond or two: look again
				// soon, even past MaxDelay.
				r.Log.Debug("..data_tmp present: swap in progress, waiting")
				timer.Reset(min(r.Debounce, 10*time.Millisecond))
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
				timer.Reset(max(0, min(r.Debounce, pending.Add(r.MaxDelay).Sub(time.Now()))))
			case nextRetry:
				backoff = min(max(2*backoff, retryMin), r.RetryMax)
				r.Log.Info("retrying", "in", backoff)
				timer.Reset(backoff)
			}
		}
	}
}

// attempt brings the target to the content the directories show (in API
// mode after writing the desired content there).
func (r *Reloader) attempt(ctx context.Context, force bool) next {
	if r.Source != nil {
		if n := r.apply(ctx, force); n != nextDone {
			return n
		}
	}
	snap, err := r.Snapshot(r.Dirs)
	if err != nil {
		r.Metrics.Reloads.WithLabelValues(ResultError).Inc()
		r.Log.Error("cannot read the watched directories; retrying", "err", err)
		return nextRetry
	}
	if snap.Fingerprint == r.loaded {
		r.Log.Debug("the target already serves this content; not reloading")
		if r.OnSettle != nil {
			r.OnSettle(false)
		}
		return nextDone
	}
	if snap.Fingerprint != r.seen {
		r.seen = snap.Fingerprint
		r.Metrics.Changes.Inc()
		if r.OnSettle != nil {
			r.OnSettle(true)
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
		// until they are pushed: they count as served once accepted.
		keys := maps.Clone(snap.Keys)
		for _, k := range peersKeys(keys) {
			if old, ok := r.loadedKeys[k]; ok {
				keys[k] = old
			}
		}
		r.loadedKeys = keys
		r.loaded = snap.Fingerprint
		r.reloadedAt = r.Now()
		if sk, ok := r.pushAll(ctx, snap); sk != nil {
			r.loadedKeys = sk
			if !ok {
				r.loaded = ""
			}
		} else {
			r.loadedKeys = snap.Keys
		}
		if r.Report != nil {
			how := served.HowReload
			if o.Result == ResultSignalled {
				how = served.HowSignal
			}
			r.Report(r.servedReportKeys(r.loadedKeys, how))
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
	start := r.Now()
	o := r.reload(ctx, snap)
	o.Started, o.Elapsed, o.Fingerprint = start, r.Now().Sub(start), snap.Fingerprint
	o.Quarantined = r.quarantinedKeys()
	r.Metrics.Reloads.WithLabelValues(o.Result).Inc()
	r.Metrics.LastAttempt.Set(float64(r.Now().Unix()))
	if o.Result == ResultSuccess || o.Result == ResultSignalled {
		r.Metrics.LastSuccess.Set(float64(r.Now().Unix()))
	}
	if o.PID != 0 && o.Result != ResultContentChanged {
		r.Metrics.ReloadDuration.Observe(o.Elapsed.Seconds())
	}
	log := r.Log.With("result", o.Result, "pid", o.PID, "elapsed", o.Elapsed.Round(time.Millisecond), "content", shortFP(snap.Fingerprint))
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
	if r.OnReload != nil {
		r.OnReload(o)
	}
	return o
}

func (r *Reloader) reload(ctx context.Context, snap Snapshot) Outcome {
	procs, err := ListProcesses(r.ProcRoot)
	if err != nil {
		return Outcome{Result: ResultError, Err: err}
	}
	target, err := FindTarget(procs, r.Process, r.Self)
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
	if len(r.CheckCmd) > 0 && snap.Fingerprint != r.checked {
		if err := r.check(ctx); err != nil {
			o.Result, o.Err, o.Keys = ResultCheckFailed, err, failingKeys(err.Error(), r.Dirs)
			return o
		}
		checked = true
	}
	if r.SockDir != "" {
		r.cleanSockets()
	}

	r.lastPID = target.PID
	before := Children(r.ProcRoot, target.PID)
	// The check ran on the content the snapshot names only if that is
	// still what the directories show: a kubelet "..data" target is never
	// modified, so the same target means the same bytes. Taken last, right
	// before the signal.
	if id, err := ContentID(r.Dirs); err != nil || id != snap.ID {
		o.Result, o.Err = ResultContentChanged, fmt.Errorf("content %q checked, %q in place now (%v)", snap.ID, id, err)
		return o
	}
	if checked {
		r.checked = snap.Fingerprint
	}
	if err := r.Signaller.Signal(target.PID, r.Signal); err != nil {
		o.Result, o.Err = ResultError, fmt.Errorf("signal %d: %w", target.PID, err)
		return o
	}
	// Only a HUP to a master with workers is verifiable: nginx replaces
	// every worker on a good reload and keeps them all on a bad one (it
	// logs no "reload failed" line).
	if r.Signal != syscall.SIGHUP || len(before) == 0 {
		o.Result = ResultSignalled
		return o
	}
	if r.waitNewChild(ctx, target.PID, before) {
		o.Result = ResultSuccess
	} else {
		o.Result = ResultFailed
		o.Err = fmt.Errorf("children of %d still %v after %s", target.PID, before, r.VerifyTimeout)
	}
	return o
}

// targetPID is the pid of the one matching process, 0 if none or several.
func (r *Reloader) targetPID() int {
	procs, err := ListProcesses(r.ProcRoot)
	if err != nil {
		return 0
	}
	p, err := FindTarget(procs, r.Process, r.Self)
	if err != nil {
		return 0
	}
	return p.PID
}

// verifyPoll is how often the children are re-read while verifying; a
// reload takes tens to hundreds of milliseconds.
const verifyPoll = 10 * time.Millisecond

func (r *Reloader) waitNewChild(ctx context.Context, pid int, before []int) bool {
	ctx, cancel := context.WithTimeout(ctx, r.VerifyTimeout)
	defer cancel()
	t := time.NewTicker(verifyPoll)
	defer t.Stop()
	for {
		for _, c := range Children(r.ProcRoot, pid) {
			if !slices.Contains(before, c) {
				return true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// maxCheckOutput bounds the check command's output kept in the log.
const maxCheckOutput = 8 << 10

func (r *Reloader) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.CheckTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, r.CheckCmd[0], r.CheckCmd[1:]...).CombinedOutput()
	if err == nil {
		return nil
	}
	if len(out) > maxCheckOutput {
		out = append(out[:maxCheckOutput], "…"...)
	}
	return fmt.Errorf("%q: %w: %s", r.CheckCmd, err, out)
}

func (r *Reloader) cleanSockets() {
	refs, err := ReferencedSockets(r.Dirs)
	if err != nil {
		r.Log.Warn("cannot read route files for socket references", "err", err)
	}
	acts, err := CleanSockets(r.SockDir, refs)
	if err != nil {
		r.Log.Warn("cannot clean the socket directory", "dir", r.SockDir, "err", err)
		return
	}
	for _, a := range acts {
		switch {
		case a.Removed:
			r.Metrics.StaleSockets.Inc()
			r.Log.Info("removed stale socket (connect refused)", "path", a.Path, "referenced", a.Referenced)
		case a.Err != nil:
			r.Log.Warn("cannot remove stale socket", "path", a.Path, "err", a.Err)
		case a.State == SocketLive && !a.Referenced:
			r.Log.Debug("unreferenced socket is live; leaving it to nginx", "path", a.Path)
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
