package reload

// This file: the signal trigger. A change reaches the target as a signal
// (HUP) to its main process: the check first (--check-cmd), then the
// stale sockets removed (--sock-dir), the signal, and the verification by
// the worker pids. After a verified reload every peers table is pushed
// again (push.go).

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"syscall"
	"time"

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

// signalTrigger brings any change to the target by a signal to its main
// process (trigger), and keeps the target's stale sockets swept.
type signalTrigger struct {
	*env
	procRoot      string        // --proc-root
	process       string        // --process
	sockDir       string        // --sock-dir ("" = no socket sweep)
	verifyTimeout time.Duration // --verify-timeout
	signal        syscall.Signal
	check         *checker
	// push brings every table again after a reload (a new route's dict
	// exists only after it).
	push *pusher
	// quarantined, in API mode, names the keys held back (applier).
	quarantined func() []string

	// Seams: New sets the real ones; only tests replace them.
	self int       // our pid, never matched
	kill Signaller // kill(2)
	// onReload, nil outside tests (testhooks.go), is called after every
	// attempt.
	onReload func(Outcome)
	// onVerified, nil outside tests, is called with the content id found
	// in place right before the signal (the last look; a swap after it
	// reaches the target unchecked, and the target's own load refuses it).
	onVerified func(id string)

	lastPID int // target seen by the last socket sweep or signal (0 = none)
}

var _ trigger = (*signalTrigger)(nil)

// fire implements trigger: it takes every change.
func (s *signalTrigger) fire(ctx context.Context, snap Snapshot, sv *serving) (next, bool) {
	o := s.reloadFor(ctx, snap)
	switch o.Result {
	case ResultSuccess, ResultSignalled:
		// The reloaded engine keeps picking from the tables it holds
		// until they are pushed: they count as served once accepted (a
		// new one not before).
		keys := maps.Clone(snap.Keys)
		for _, k := range peersKeys(keys) {
			if old, ok := sv.keys[k]; ok {
				keys[k] = old
			} else {
				delete(keys, k)
			}
		}
		sv.keys = keys
		sv.loaded = snap.Fingerprint
		s.push.reloaded(snap)
		if sk, ok := s.push.pushAll(ctx, snap, sv); sk != nil {
			sv.keys = sk
			if !ok {
				sv.loaded = ""
			}
		} else {
			sv.keys = snap.Keys
		}
		if s.report != nil {
			how := served.HowReload
			if o.Result == ResultSignalled {
				how = served.HowSignal
			}
			s.report(sv.report(how, s.now()))
		}
		return nextDone, true
	case ResultContentChanged:
		return nextSettle, true
	case ResultCheckFailed, ResultFailed:
		return nextResync, true
	default:
		return nextRetry, true
	}
}

// reloadFor signals the target for snap and records the attempt: the
// metrics, one log line, and the onReload observer.
func (s *signalTrigger) reloadFor(ctx context.Context, snap Snapshot) Outcome {
	start := s.now()
	o := s.reload(ctx, snap)
	o.Started, o.Elapsed, o.Fingerprint = start, s.now().Sub(start), snap.Fingerprint
	if s.quarantined != nil {
		o.Quarantined = s.quarantined()
	}
	s.metrics.Reloads.WithLabelValues(o.Result).Inc()
	s.metrics.LastAttempt.Set(float64(s.now().Unix()))
	if o.Result == ResultSuccess || o.Result == ResultSignalled {
		s.metrics.LastSuccess.Set(float64(s.now().Unix()))
	}
	if o.PID != 0 && o.Result != ResultContentChanged {
		s.metrics.ReloadDuration.Observe(o.Elapsed.Seconds())
	}
	log := s.log.With("result", o.Result, "pid", o.PID, "elapsed", o.Elapsed.Round(time.Millisecond), "content", shortFP(snap.Fingerprint))
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
	if s.onReload != nil {
		s.onReload(o)
	}
	return o
}

// reload finds the target, checks snap (unless that content passed
// already), removes stale sockets, signals and verifies.
func (s *signalTrigger) reload(ctx context.Context, snap Snapshot) Outcome {
	procs, err := ListProcesses(s.procRoot)
	if err != nil {
		return Outcome{Result: ResultError, Err: err}
	}
	target, err := FindTarget(procs, s.process, s.self)
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
	if s.check.enabled() && snap.Fingerprint != s.check.passed {
		if err := s.check.run(ctx); err != nil {
			o.Result, o.Err, o.Keys = ResultCheckFailed, err, failingKeys(err.Error(), s.dirs)
			return o
		}
		checked = true
	}
	if s.sockDir != "" {
		s.cleanSockets()
	}

	s.lastPID = target.PID
	before := Children(s.procRoot, target.PID)
	// The check ran on the content the snapshot names only if that is
	// still what the directories show: a kubelet "..data" target is never
	// modified, so the same target means the same bytes. Taken last, right
	// before the signal.
	if id, err := ContentID(s.dirs); err != nil || id != snap.ID {
		o.Result, o.Err = ResultContentChanged, fmt.Errorf("content %q checked, %q in place now (%v)", snap.ID, id, err)
		return o
	}
	if s.onVerified != nil {
		s.onVerified(snap.ID)
	}
	if checked {
		s.check.passed = snap.Fingerprint
	}
	if err := s.kill.Signal(target.PID, s.signal); err != nil {
		o.Result, o.Err = ResultError, fmt.Errorf("signal %d: %w", target.PID, err)
		return o
	}
	// Only a HUP to a master with workers is verifiable: nginx replaces
	// every worker on a good reload and keeps them all on a bad one (it
	// logs no "reload failed" line).
	if s.signal != syscall.SIGHUP || len(before) == 0 {
		o.Result = ResultSignalled
		return o
	}
	if s.waitNewChild(ctx, target.PID, before) {
		o.Result = ResultSuccess
	} else {
		o.Result = ResultFailed
		o.Err = fmt.Errorf("children of %d still %v after %s", target.PID, before, s.verifyTimeout)
	}
	return o
}

// targetPID is the pid of the one matching process, 0 if none or several.
func (s *signalTrigger) targetPID() int {
	procs, err := ListProcesses(s.procRoot)
	if err != nil {
		return 0
	}
	p, err := FindTarget(procs, s.process, s.self)
	if err != nil {
		return 0
	}
	return p.PID
}

// sweep removes stale sockets when the target is gone or was replaced
// since the last look: a master that crashed leaves its sockets behind,
// and the restarted one retries bind() only for about 2.5 s before giving
// up. It returns the target's pid now (0 = none) and whether it changed.
func (s *signalTrigger) sweep() (pid int, changed bool) {
	pid = s.targetPID()
	if pid == s.lastPID && pid != 0 {
		return pid, false
	}
	if changed = pid != s.lastPID; changed {
		s.log.Info("target process changed; checking sockets", "old", s.lastPID, "new", pid)
	}
	s.lastPID = pid
	s.cleanSockets()
	return pid, changed
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
func (s *signalTrigger) waitNewChild(ctx context.Context, pid int, before []int) bool {
	ctx, cancel := context.WithTimeout(ctx, s.verifyTimeout)
	defer cancel()
	t := time.NewTicker(verifyPoll)
	defer t.Stop()
	took := false
	for {
		if !took {
			for _, c := range Children(s.procRoot, pid) {
				if !slices.Contains(before, c) {
					took = true
					break
				}
			}
		}
		if took && len(Accepting(s.procRoot, pid, before)) == 0 {
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

// cleanSockets removes the stale sockets of --sock-dir (sockets.go),
// logging each and counting the removed ones.
func (s *signalTrigger) cleanSockets() {
	refs, err := ReferencedSockets(s.dirs)
	if err != nil {
		s.log.Warn("cannot read route files for socket references", "err", err)
	}
	acts, err := CleanSockets(s.sockDir, refs)
	if err != nil {
		s.log.Warn("cannot clean the socket directory", "dir", s.sockDir, "err", err)
		return
	}
	for _, a := range acts {
		switch {
		case a.Removed:
			s.metrics.StaleSockets.Inc()
			s.log.Info("removed stale socket (connect refused)", "path", a.Path, "referenced", a.Referenced)
		case a.Err != nil:
			s.log.Warn("cannot remove stale socket", "path", a.Path, "err", a.Err)
		case a.State == SocketLive && !a.Referenced:
			s.log.Debug("unreferenced socket is live; leaving it to nginx", "path", a.Path)
		}
	}
}
