// The label loop: every interval (or when the elector changes state) read
// the own pod, decide whether it should be active, and fix its label;
// plus the transition logging and metrics of that loop.

package hagate

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// FieldManager names hagate's writes in managedFields.
const FieldManager = "hagate"

// Config wires a Gate. Client, Namespace, PodName, LeaseName, LabelKey and
// App are required; the durations must satisfy Options.Validate.
type Config struct {
	Client    kubernetes.Interface
	Namespace string
	PodName   string
	LeaseName string
	LabelKey  string

	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	Interval      time.Duration

	App       AppProbe
	Listeners ListenerGate     // nil: no listeners required
	Clock     clock.WithTicker // nil: wall clock
	Logger    *slog.Logger     // nil: slog.Default()
	Metrics   *Metrics         // nil: a private, unserved set
}

// Gate runs the election and the label loop for one pod.
type Gate struct {
	cfg  Config
	kick chan struct{}
	el   *election // owned by the Run goroutine

	lastTick atomic.Int64 // unix nanos of the last finished tick, for /healthz

	// afterLeaderRead (tests only) runs right after a pass has read
	// whether it holds the Lease, to stage the election deciding mid-pass.
	afterLeaderRead func(leader bool)
	// beforeLeaseWrite (tests only) runs before each Lease create/update.
	beforeLeaseWrite func()

	// Transition logging state (Run goroutine only).
	logged struct {
		init, healthy, leader, active, podErr bool
		why                                   string
	}
}

// New checks cfg and returns a Gate.
func New(cfg Config) (*Gate, error) {
	if cfg.Client == nil || cfg.App == nil {
		return nil, errors.New("hagate: Client and App are required")
	}
	if cfg.Namespace == "" || cfg.PodName == "" || cfg.LeaseName == "" || cfg.LabelKey == "" {
		return nil, errors.New("hagate: Namespace, PodName, LeaseName and LabelKey are required")
	}
	if cfg.Interval <= 0 || cfg.RetryPeriod <= 0 || cfg.RenewDeadline <= 0 || cfg.LeaseDuration <= cfg.RenewDeadline {
		return nil, errors.New("hagate: need 0 < RenewDeadline < LeaseDuration and positive RetryPeriod and Interval")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	return &Gate{cfg: cfg, kick: make(chan struct{}, 1)}, nil
}

// LastTick is when the label loop last finished a pass (zero before the
// first); /healthz uses it to detect a wedged loop.
func (g *Gate) LastTick() time.Time {
	n := g.lastTick.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func (g *Gate) poke() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// Run loops until ctx is cancelled, then releases the Lease (if held)
// without touching the label and returns nil. That is the planned-shutdown
// path: the caller cancels ctx on SIGTERM.
func (g *Gate) Run(ctx context.Context) error {
	t := g.cfg.Clock.NewTicker(g.cfg.Interval)
	defer t.Stop()
	// No label write may follow the release: the loop has exited before
	// stopElection runs, so nothing can race it.
	defer g.stopElection()
	for {
		g.tick(ctx)
		var lost <-chan struct{}
		if g.el != nil {
			lost = g.el.done
		}
		select {
		case <-ctx.Done():
			g.cfg.Logger.Info("shutting down: releasing the Lease and keeping the label so in-flight streams drain",
				"leader", g.holdsLease())
			return nil
		case <-t.C():
		case <-g.kick:
		case <-lost:
			// The elector gave up (renewal failed or the Lease was taken):
			// reap it now so the next tick drops the label at once.
			g.el = nil
		}
	}
}

// tick compares the pod's label with the desired state and fixes it.
func (g *Gate) tick(ctx context.Context) {
	healthy, why := g.health(ctx)
	defer func() {
		g.lastTick.Store(g.cfg.Clock.Now().UnixNano())
		g.cfg.Logger.Debug("pass done", "healthy", healthy, "leader", g.logged.leader, "active", g.logged.active)
	}()
	if ctx.Err() != nil {
		return
	}
	g.cfg.Metrics.healthy.Set(b2f(healthy))
	// A conflicting write (the pod changed between our read and our
	// patch) is retried at once with a fresh read, a few times.
	for attempt := 0; attempt < 3; attempt++ {
		err := g.reconcile(ctx, healthy, why)
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return
		}
		g.cfg.Logger.Debug("pod changed under us; retrying", "error", err)
	}
}

func (g *Gate) reconcile(ctx context.Context, healthy bool, why string) error {
	pod, err := g.getPod(ctx)
	g.logPodErr(err)
	if ctx.Err() != nil {
		return nil
	}
	terminating := pod != nil && pod.DeletionTimestamp != nil
	contend := healthy && !terminating
	have := pod != nil && pod.Labels[g.cfg.LabelKey] == "true"

	if !contend && g.el != nil {
		// Drop the label before giving the Lease up, so the next leader
		// never sees two labelled pods because of us. A terminating pod
		// keeps its label to drain.
		if have && !terminating {
			if err := g.patchLabel(ctx, pod, false); err != nil {
				g.cfg.Logger.Warn("cannot remove active label before releasing the Lease", "error", err)
			} else {
				have = false
			}
		}
		g.stopElection()
	}
	if contend && g.el == nil {
		g.startElection()
	}
	leader := g.holdsLease()
	if g.afterLeaderRead != nil {
		g.afterLeaderRead(leader)
	}
	g.logState(healthy, why, leader, terminating)
	if pod == nil {
		return nil
	}
	switch {
	case terminating:
		// Keep whatever the label is: an active pod drains.
	case leader:
		if err := g.fence(ctx); err != nil {
			// Without proof that nobody else is active we must not add
			// our label; a label we already carry stays (the other pod's
			// is the stale one).
			g.cfg.Logger.Warn("cannot clear stale active labels from other pods; not activating", "error", err)
			g.setActive(have)
			return err
		}
		if !have {
			if err := g.patchLabel(ctx, pod, true); err != nil {
				g.setActive(false)
				return err
			}
			have = true
		}
	case have && (g.electionUndecided() || g.holdsLease()):
		// Just (re)started with the label on: our first attempt at the
		// Lease is in flight. If we still hold it (a restarted leader
		// keeps its identity) removing the label now would only flap the
		// Service; if someone else holds it, the answer comes within a
		// round trip and that leader clears our label anyway.
		// holdsLease is asked again because the election may have decided
		// for us since leader was read above (then electionUndecided is
		// false already); the pass OnStartedLeading pokes fences and keeps
		// the label.
	case have:
		if err := g.patchLabel(ctx, pod, false); err != nil {
			g.setActive(true)
			return err
		}
		have = false
	}
	g.setActive(have)
	return nil
}

func (g *Gate) setActive(active bool) {
	g.cfg.Metrics.active.Set(b2f(active))
	if g.logged.init && active == g.logged.active {
		return
	}
	if g.logged.init || active {
		to := "inactive"
		if active {
			to = "active"
		}
		g.cfg.Metrics.activeTransitions.WithLabelValues(to).Inc()
		g.cfg.Logger.Info("pod is "+to, "pod", g.cfg.PodName)
	}
	g.logged.active = active
}

func (g *Gate) logState(healthy bool, why string, leader, terminating bool) {
	log := g.cfg.Logger
	first := !g.logged.init
	if first || healthy != g.logged.healthy || why != g.logged.why {
		if healthy {
			log.Info("app healthy; contending for the Lease", "lease", g.cfg.LeaseName)
		} else {
			log.Warn("app unhealthy; not contending for the Lease", "lease", g.cfg.LeaseName, "reason", why)
		}
	}
	if (first && leader) || (!first && leader != g.logged.leader) {
		to := "standby"
		if leader {
			to = "leader"
		}
		g.cfg.Metrics.leaderTransitions.WithLabelValues(to).Inc()
		log.Info("now "+to, "lease", g.cfg.LeaseName, "terminating", terminating)
	}
	g.cfg.Metrics.isLeader.Set(b2f(leader))
	g.logged.init, g.logged.healthy, g.logged.why, g.logged.leader = true, healthy, why, leader
}

func (g *Gate) logPodErr(err error) {
	if err != nil {
		g.cfg.Metrics.apiErrors.WithLabelValues("get").Inc()
	}
	if (err != nil) == g.logged.podErr {
		return
	}
	g.logged.podErr = err != nil
	if err != nil {
		g.cfg.Logger.Error("cannot read own pod", "pod", g.cfg.PodName, "error", err)
	} else {
		g.cfg.Logger.Info("own pod readable again", "pod", g.cfg.PodName)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
