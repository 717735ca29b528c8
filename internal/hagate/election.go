// Leader election: one run of client-go's elector on the Lease, and the
// resource lock wrapper that records when our renewals succeeded.

package hagate

import (
	"context"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
)

// election is one run of client-go's leader elector. A replica that turns
// unhealthy stops its run (releasing the Lease) and starts a new one when
// healthy again.
type election struct {
	le      *leaderelection.LeaderElector
	lock    *trackingLock
	started time.Time
	cancel  context.CancelFunc
	done    chan struct{}
}

// electionUndecided is true while a just-started election has not decided
// yet, for at most RenewDeadline: no answer said someone else holds the
// Lease or our write failed, and no write of ours succeeded. Reading our
// own name as holder (a restarted leader) is not a decision, although
// client-go's IsLeader turns true on that read alone: the renewal that
// follows is the decision.
func (g *Gate) electionUndecided() bool {
	if g.el == nil || g.el.lock.hasAnswered() || g.cfg.Clock.Since(g.el.started) >= g.cfg.RenewDeadline {
		return false
	}
	return !g.el.le.IsLeader() || g.el.lock.renewedAt().IsZero()
}

func (g *Gate) startElection() {
	lock := &trackingLock{
		Interface: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: g.cfg.Namespace, Name: g.cfg.LeaseName},
			Client:     g.cfg.Client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: g.cfg.PodName},
		},
		clock:  g.cfg.Clock,
		before: g.beforeLeaseWrite,
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   g.cfg.LeaseDuration,
		RenewDeadline:   g.cfg.RenewDeadline,
		RetryPeriod:     g.cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            g.cfg.LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			// Only hints: the tick derives leadership from the lock.
			OnStartedLeading: func(context.Context) { g.poke() },
			OnStoppedLeading: g.poke,
		},
	})
	if err != nil {
		// Durations are validated up front; this is a programming error.
		g.cfg.Logger.Error("cannot start leader election", "error", err)
		return
	}
	// The elector's context is not derived from Run's: on shutdown the
	// label loop stops first and only then is the Lease released.
	ctx, cancel := context.WithCancel(context.Background())
	el := &election{le: le, lock: lock, started: g.cfg.Clock.Now(), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(el.done)
		le.Run(ctx)
	}()
	g.el = el
}

// stopElection cancels the current run and waits until client-go has
// released the Lease (bounded by RenewDeadline).
func (g *Gate) stopElection() {
	if g.el == nil {
		return
	}
	g.el.cancel()
	<-g.el.done
	g.el = nil
	g.poke()
}

// holdsLease is true while the elector believes it leads and its last
// successful renewal is younger than RenewDeadline. A standby may take
// over only LeaseDuration after it observed that renewal, which leaves
// LeaseDuration-RenewDeadline of margin for a write already in flight.
func (g *Gate) holdsLease() bool {
	if g.el == nil || !g.el.le.IsLeader() {
		return false
	}
	at := g.el.lock.renewedAt()
	return !at.IsZero() && g.cfg.Clock.Since(at) < g.cfg.RenewDeadline
}

// leaseValidUntil is the latest moment a label write may still land.
func (g *Gate) leaseValidUntil() (time.Time, bool) {
	if g.el == nil {
		return time.Time{}, false
	}
	at := g.el.lock.renewedAt()
	if at.IsZero() {
		return time.Time{}, false
	}
	return at.Add(g.cfg.LeaseDuration), true
}

// trackingLock records when a write naming us as holder last succeeded,
// using the time the write started (a conservative bound: nobody can have
// observed it earlier).
type trackingLock struct {
	resourcelock.Interface
	clock  clock.PassiveClock
	before func() // tests only: runs before each write

	mu       sync.Mutex
	at       time.Time
	answered bool // a Get showed another holder (or failed), or a Create/Update returned
}

func (l *trackingLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	rec, raw, err := l.Interface.Get(ctx)
	if err == nil && rec != nil && rec.HolderIdentity == l.Identity() {
		// Still ours (a restarted leader): the renewal decides.
		return rec, raw, err
	}
	l.mu.Lock()
	l.answered = true
	l.mu.Unlock()
	return rec, raw, err
}

func (l *trackingLock) hasAnswered() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.answered
}

var _ resourcelock.Interface = (*trackingLock)(nil)

func (l *trackingLock) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	if l.before != nil {
		l.before()
	}
	start := l.clock.Now()
	err := l.Interface.Create(ctx, rec)
	l.note(start, rec, err)
	return err
}

func (l *trackingLock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	if l.before != nil {
		l.before()
	}
	start := l.clock.Now()
	err := l.Interface.Update(ctx, rec)
	l.note(start, rec, err)
	return err
}

func (l *trackingLock) note(start time.Time, rec resourcelock.LeaderElectionRecord, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.answered = true
	}
	switch {
	case rec.HolderIdentity != l.Identity():
		// A release (empty holder) ends our tenure whatever the outcome.
		l.at = time.Time{}
	case err == nil && start.After(l.at):
		l.at = start
	}
}

func (l *trackingLock) renewedAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.at
}
