package reload

// This file: the loop. fsnotify on the directories; a burst of events
// (kubelet's "..data" symlink swap is several) is coalesced by a debounce
// bounded by --max-delay, a half-done swap ("..data_tmp" present) is never
// acted on, and the content fingerprint (snapshot.go) tells a change from
// a touch. Each settled change is one attempt (reloader.go); the resync
// ticker looks again without an event, the sweep ticker watches the
// target's pid for stale sockets (signal.go) and a new master (push.go).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/modelsphere/autoconfig/internal/served"
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
	r.serving = serving{loaded: snap.Fingerprint, keys: snap.Keys, peers: map[string]string{}}
	r.seen = snap.Fingerprint
	r.push.start(snap)
	if r.report != nil {
		r.report(servedReport(snap, served.HowStart, r.now()))
	}
	var changes <-chan struct{}
	if r.api != nil {
		if changes, err = r.api.start(); err != nil {
			return err
		}
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
		r.sig.lastPID = r.sig.targetPID()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sweep:
			// Clean as soon as the target is gone or replaced; a new
			// master gets every table.
			pid, changed := r.sig.sweep()
			if changed {
				r.push.newMaster(pid)
			}
			if pid != 0 {
				r.push.repushAll(ctx, &r.serving)
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
			if r.push.path != "" && r.api.peersOnly() && r.push.listening() {
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
			r.push.tick()
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
