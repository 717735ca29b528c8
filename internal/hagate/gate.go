// Package hagate keeps exactly one replica of a stateful router active:
// every replica joins leader election on the Lease <name>-ha and only the
// leader labels its own pod <name>-active=true, so a Service selecting that
// label has one endpoint while every replica stays Ready.
//
// The gate is level-triggered: every interval it reads its own pod and the
// Lease state and fixes the label, so a label removed or added by hand is
// corrected, and a leader whose app stops accepting connections drops its
// label and gives the Lease up.
//
// The invariant is "never two pods active unless one of them is
// terminating". It rests on four rules:
//
//   - A label is added only while the Lease is held (checked immediately
//     before the patch, against the time of the last successful renewal),
//     with a JSON patch that tests the pod's resourceVersion, and with a
//     request deadline inside the Lease's validity.
//   - A leader first removes the label from every other pod that carries it
//     and is not terminating (a crashed hagate or a dead node leaves its
//     pod labelled); it does not add its own label until that succeeded.
//   - A leader that stops being healthy removes its label before it
//     releases the Lease; one that loses the Lease drops the label at once.
//   - On planned shutdown (context cancelled, e.g. SIGTERM) the label is left
//     alone and the Lease released, so the terminating pod drains in-flight
//     streams while the standby takes new traffic. A pod with a
//     deletionTimestamp never contends and its label is never touched.
package hagate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
)

// FieldManager names hagate's writes in managedFields.
const FieldManager = "hagate"

// ListenerGate reports whether the required local listeners are present
// and, if not, which ports are missing.
type ListenerGate interface {
	Present(ctx context.Context) (bool, []int)
}

// AppProbe reports whether the local app accepts connections.
type AppProbe interface {
	Probe(ctx context.Context) error
}

// TCPProbe is an AppProbe that opens (and closes) a TCP connection.
type TCPProbe struct {
	Addr    string
	Timeout time.Duration
}

var _ AppProbe = TCPProbe{}

// Probe dials Addr within Timeout.
func (p TCPProbe) Probe(ctx context.Context) error {
	d := net.Dialer{Timeout: p.Timeout}
	c, err := d.DialContext(ctx, "tcp", p.Addr)
	if err != nil {
		return err
	}
	return c.Close()
}

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

func (g *Gate) health(ctx context.Context) (bool, string) {
	if err := g.cfg.App.Probe(ctx); err != nil {
		return false, "app port not accepting connections: " + err.Error()
	}
	if g.cfg.Listeners != nil {
		if ok, missing := g.cfg.Listeners.Present(ctx); !ok {
			return false, fmt.Sprintf("required listeners missing: %v", missing)
		}
	}
	return true, ""
}

// apiCtx bounds one API call so a hung connection cannot wedge the loop.
func (g *Gate) apiCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, g.cfg.RenewDeadline)
}

func (g *Gate) getPod(ctx context.Context) (*corev1.Pod, error) {
	ctx, cancel := g.apiCtx(ctx)
	defer cancel()
	return g.cfg.Client.CoreV1().Pods(g.cfg.Namespace).Get(ctx, g.cfg.PodName, metav1.GetOptions{})
}

// fence removes the label from every other non-terminating pod. Such a
// label is stale: we hold the Lease, so its owner is not the leader (its
// hagate crashed, its node died, or someone added it by hand).
func (g *Gate) fence(ctx context.Context) error {
	lctx, cancel := g.apiCtx(ctx)
	defer cancel()
	list, err := g.cfg.Client.CoreV1().Pods(g.cfg.Namespace).List(lctx, metav1.ListOptions{
		LabelSelector: g.cfg.LabelKey + "=true",
	})
	if err != nil {
		g.cfg.Metrics.apiErrors.WithLabelValues("list").Inc()
		return fmt.Errorf("list active pods: %w", err)
	}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Name == g.cfg.PodName || p.DeletionTimestamp != nil {
			continue
		}
		if err := g.patchLabel(ctx, p, false); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("remove stale label from pod %s: %w", p.Name, err)
		}
		g.cfg.Metrics.fixes.WithLabelValues("fence").Inc()
		g.cfg.Logger.Warn("removed stale active label from another pod", "pod", p.Name)
	}
	return nil
}

// patchLabel adds (value "true") or removes the label on pod with a JSON
// patch whose first op tests the resourceVersion we read, so a decision
// made on a stale read is rejected rather than applied.
func (g *Gate) patchLabel(ctx context.Context, pod *corev1.Pod, add bool) error {
	var (
		ctxPatch context.Context
		cancel   context.CancelFunc
	)
	if add {
		// Check leadership immediately before the write, and give the
		// request a deadline inside the Lease we hold: a patch delayed past
		// the point where a standby may take over is abandoned.
		until, ok := g.leaseValidUntil()
		if !ok || !g.holdsLease() {
			return errNotLeader
		}
		ctxPatch, cancel = context.WithDeadline(ctx, until)
	} else {
		ctxPatch, cancel = g.apiCtx(ctx)
	}
	defer cancel()
	data, err := labelPatch(pod, g.cfg.LabelKey, add)
	if err != nil {
		return err
	}
	_, err = g.cfg.Client.CoreV1().Pods(pod.Namespace).Patch(ctxPatch, pod.Name, types.JSONPatchType, data,
		metav1.PatchOptions{FieldManager: FieldManager})
	if err != nil {
		g.cfg.Metrics.apiErrors.WithLabelValues("patch").Inc()
		return fmt.Errorf("patch pod %s: %w", pod.Name, err)
	}
	if pod.Name == g.cfg.PodName {
		action, msg := "remove", "active label removed"
		if add {
			action, msg = "add", "active label added"
		}
		g.cfg.Metrics.fixes.WithLabelValues(action).Inc()
		g.cfg.Logger.Info(msg, "label", g.cfg.LabelKey, "pod", pod.Name)
	}
	return nil
}

var errNotLeader = errors.New("not holding the Lease")

// retryable reports errors worth an immediate retry with a fresh read:
// the resourceVersion test failed (the apiserver answers 422 for a failed
// JSON-patch test) or an optimistic-concurrency conflict.
func retryable(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsInvalid(err)
}

type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// labelPatch builds [test resourceVersion, add|remove label].
func labelPatch(pod *corev1.Pod, key string, add bool) ([]byte, error) {
	ops := []jsonPatchOp{{Op: "test", Path: "/metadata/resourceVersion", Value: pod.ResourceVersion}}
	path := "/metadata/labels/" + escapeJSONPointer(key)
	switch {
	case add && pod.Labels == nil:
		ops = append(ops, jsonPatchOp{Op: "add", Path: "/metadata/labels", Value: map[string]string{key: "true"}})
	case add:
		// "add" on an existing member replaces it (RFC 6902 4.1).
		ops = append(ops, jsonPatchOp{Op: "add", Path: path, Value: "true"})
	default:
		if _, ok := pod.Labels[key]; !ok {
			return nil, fmt.Errorf("pod %s has no label %s", pod.Name, key)
		}
		ops = append(ops, jsonPatchOp{Op: "remove", Path: path})
	}
	return json.Marshal(ops)
}

func escapeJSONPointer(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
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
