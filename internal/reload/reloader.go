package reload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
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
	// Fingerprint of the directories' content this attempt was for
	// (empty for a direct ReloadOnce call).
	Fingerprint string
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
	// OnReload, if set, is called after every attempt (tests, benchmarks).
	OnReload func(Outcome)
	// OnSettle, if set, is called each time the directories went quiet,
	// with whether their visible content changed (tests).
	OnSettle func(changed bool)
	// Started, if set, is closed once the watches are in place.
	Started chan struct{}

	lastPID int // target seen by the last socket sweep (0 = none)
}

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
}

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
	last, err := Fingerprint(r.Dirs)
	if err != nil {
		return fmt.Errorf("read watched directories: %w", err)
	}
	r.Log.Info("watching", "dirs", r.Dirs, "process", r.Process, "debounce", r.Debounce, "maxDelay", r.MaxDelay)
	if r.Started != nil {
		close(r.Started)
	}

	timer := time.NewTimer(r.Debounce)
	timer.Stop()
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
				}
				r.lastPID = pid
				r.cleanSockets()
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
		case <-timer.C:
			if swapInProgress(r.Dirs) {
				// A kubelet swap takes a millisecond or two: look again
				// soon, even past MaxDelay.
				r.Log.Debug("..data_tmp present: swap in progress, waiting")
				timer.Reset(min(r.Debounce, 10*time.Millisecond))
				continue
			}
			pending = time.Time{}
			fp, err := Fingerprint(r.Dirs)
			if err != nil {
				r.Log.Error("cannot read watched directories; will retry on the next change", "err", err)
				continue
			}
			if fp == last {
				r.Log.Debug("events without a visible change; not reloading")
				if r.OnSettle != nil {
					r.OnSettle(false)
				}
				continue
			}
			// Recorded before the attempt: a failed attempt is retried on
			// the next change, not on every stray event.
			last = fp
			r.Metrics.Changes.Inc()
			if r.OnSettle != nil {
				r.OnSettle(true)
			}
			r.reloadFor(ctx, fp)
		}
	}
}

// ReloadOnce finds the target, runs the check, cleans sockets, signals and
// verifies; it logs and counts the outcome and returns it.
func (r *Reloader) ReloadOnce(ctx context.Context) Outcome {
	r.defaults()
	return r.reloadFor(ctx, "")
}

func (r *Reloader) reloadFor(ctx context.Context, fp string) Outcome {
	start := r.Now()
	o := r.reload(ctx)
	o.Started, o.Elapsed, o.Fingerprint = start, r.Now().Sub(start), fp
	r.Metrics.Reloads.WithLabelValues(o.Result).Inc()
	r.Metrics.LastAttempt.Set(float64(r.Now().Unix()))
	if o.Result == ResultSuccess || o.Result == ResultSignalled {
		r.Metrics.LastSuccess.Set(float64(r.Now().Unix()))
	}
	if o.PID != 0 {
		r.Metrics.ReloadDuration.Observe(o.Elapsed.Seconds())
	}
	log := r.Log.With("result", o.Result, "pid", o.PID, "elapsed", o.Elapsed.Round(time.Millisecond), "content", shortFP(fp))
	switch o.Result {
	case ResultSuccess:
		log.Info("reloaded: new worker processes are running")
	case ResultSignalled:
		log.Info("signalled; the target has no child processes, so the reload cannot be verified")
	case ResultFailed:
		log.Error("reload failed: worker processes did not change, the old configuration keeps serving; see the target's error log", "err", o.Err)
	case ResultCheckFailed:
		log.Error("configuration check failed; not signalling, the old configuration keeps serving", "err", o.Err)
	default:
		log.Error("not reloaded; will retry on the next change", "err", o.Err)
	}
	if r.OnReload != nil {
		r.OnReload(o)
	}
	return o
}

func (r *Reloader) reload(ctx context.Context) Outcome {
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

	if len(r.CheckCmd) > 0 {
		if err := r.check(ctx); err != nil {
			o.Result, o.Err = ResultCheckFailed, err
			return o
		}
	}
	if r.SockDir != "" {
		r.cleanSockets()
	}

	r.lastPID = target.PID
	before := Children(r.ProcRoot, target.PID)
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
