package reload

import (
	"context"
	"log/slog"
	"maps"
	"sync/atomic"
	"time"

	"github.com/modelsphere/autoconfig/internal/served"
)

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
// validated, verified signals to the target process (or pushes of peers
// tables into it). Build it with New and start it with Run; everything in
// it is private: its configuration is New's resolved copy of the Options,
// the rest is state owned by Run, split among the parts below by what
// each is about.
type Reloader struct {
	*env
	// opts is the caller's Options with the defaults filled in (New).
	opts Options

	// The parts (New builds them): how a change reaches the target
	// (triggers, in the order attempt offers it a change: push, then
	// signal), and in API mode what writes the desired content.
	sig      *signalTrigger // signal.go
	push     *pusher        // push.go
	api      *applier       // apply.go; nil in mounted mode
	triggers []trigger

	cmSync   *ConfigMapSync // the source New built from --configmap; Run runs it
	reporter *PodReporter   // the report New built from --pod-name; Run runs it
	demand   *DemandPoller  // with --pod-name and --sock-dir: the engine's demand into the report

	// onSettle, nil outside tests, is called each time the directories
	// were looked at, with whether their visible content is new.
	onSettle func(changed bool)

	ran     atomic.Bool
	started chan struct{} // closed once the watches are in place

	// State, owned by Run's goroutine.
	serving serving // what the target serves; the triggers change it
	seen    string  // fingerprint last counted as a change
}

// env is what the parts of a Reloader share: configuration New resolved
// and the seams only tests replace (before Run). None of it changes while
// Run runs.
type env struct {
	dirs    []string // watched and fingerprinted: --watch, plus --write-dir in API mode
	log     *slog.Logger
	metrics *Metrics
	// report, if set, is given what the target serves: the content
	// present at start, then each content it was seen to load
	// (served.go). It must not block.
	report   func(served.Report)
	now      func() time.Time
	snapshot func(dirs []string) (Snapshot, error) // TakeSnapshot
}

// serving is what the target serves, as far as the sidecar knows: the
// loop compares the directories with it, and the trigger that brought a
// change records what the target serves after it.
type serving struct {
	loaded string            // fingerprint of the content the target last loaded
	keys   map[string]string // hash of each key the target serves (Snapshot.Keys)
	peers  map[string]string // route → peers version the engine acknowledged
}

// report is the report of what the target serves, loaded as how says:
// keys by their full hash, and the peers versions it acknowledged.
func (s *serving) report(how string, at time.Time) served.Report {
	rep := servedReport(Snapshot{Keys: s.keys}, how, at)
	if len(s.peers) > 0 {
		rep.Peers = maps.Clone(s.peers)
	}
	return rep
}

// trigger is how a settled change reaches the target, as a Thanos
// reloader's TriggerReloader (a signal to a pid, or an HTTP call) is:
//
//   - pusher (push.go) puts peers tables into the running engine over its
//     control socket: only a change of nothing but peers tables, and only
//     while the engine listens there;
//   - signalTrigger (signal.go) checks the content, signals the target's
//     main process and verifies the reload by its workers: any change.
//
// attempt offers a change to each in that order; the first that takes it
// brings it.
type trigger interface {
	// fire brings snap to the target, which serves s before, and records
	// in s what it serves after. taken is false when this trigger cannot
	// bring this change (the next one is offered it).
	fire(ctx context.Context, snap Snapshot, s *serving) (n next, taken bool)
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

// attempt brings the target to the content the directories show (in API
// mode after writing the desired content there).
func (r *Reloader) attempt(ctx context.Context, force bool) next {
	if r.api != nil {
		if n := r.api.apply(ctx, force); n != nextDone {
			return n
		}
	}
	snap, err := r.snapshot(r.dirs)
	if err != nil {
		r.metrics.Reloads.WithLabelValues(ResultError).Inc()
		r.log.Error("cannot read the watched directories; retrying", "err", err)
		return nextRetry
	}
	r.push.keepUnserved(snap.Keys)
	if snap.Fingerprint == r.serving.loaded {
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
	for _, t := range r.triggers {
		if n, taken := t.fire(ctx, snap, &r.serving); taken {
			return n
		}
	}
	return nextRetry // not reached: the signal takes every change
}

// shortFP abbreviates a content fingerprint for logs.
func shortFP(fp string) string {
	if len(fp) > 12 {
		return fp[:12]
	}
	return fp
}
