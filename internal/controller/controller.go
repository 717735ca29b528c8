// Package controller reconciles ModelRoutes: discover the route's endpoints,
// compile them with the validated spec, write the outputs into the
// consumers' ConfigMaps, report status.
//
// Reconcile shape: get (ignore not-found) → deferred status
// patch → ordered small steps, each of which may stop the chain. Spec errors
// that retrying cannot fix end in a condition, an event and
// reconcile.TerminalError; everything that waits on the cluster (no
// backends, a missing ConfigMap, a port that cannot be derived) waits on the
// watches instead of a timer, because every input is watched.
package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/internal/informer"
	"github.com/modelsphere/autoconfig/internal/routemetrics"
	"github.com/modelsphere/autoconfig/internal/scaler"
	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// Finalizer removes the route's keys from the output ConfigMaps before the
// route goes away.
const Finalizer = "routing.modelsphere.dev/cleanup"

// Name is the controller's name (events' reportingController, metrics).
const Name = "autoconfig"

// Log verbosity levels (logr V levels).
const (
	levelDebug = 1
	levelTrace = 2
)

// Validator validates and defaults a route (schema.Validator).
type Validator interface {
	ValidateObject(*v1alpha1.ModelRoute) (*v1alpha1.ModelRoute, error)
}

// CompileFunc renders a route (compiler.Compile). Its Result must carry
// the route's keys (Result.Keys) as compiler.Compile's does: the outputs
// step and the key guard read them there.
type CompileFunc func(*compiler.Route, compiler.Snapshot, compiler.Options) (compiler.Result, error)

// Reconciler reconciles ModelRoutes. Dependencies are fields so tests can
// count writes (a wrapping Client) or use another validator.
type Reconciler struct {
	// Client reads from the cache and writes to the API server.
	Client client.Client
	// APIReader reads around the cache (after a write conflict).
	APIReader client.Reader
	// Recorder emits events on condition transitions.
	Recorder events.EventRecorder
	// Validator validates and defaults specs, once per generation.
	Validator Validator
	// Compile renders outputs; nil = compiler.Compile.
	Compile CompileFunc
	// CompileOptions are passed to every Compile.
	CompileOptions compiler.Options
	// Namespaces are the namespaces the manager's cache watches
	// (--namespace); empty = all. References elsewhere are reported.
	Namespaces []string
	// TrustedNamespaces are route namespaces whose routes may use Services
	// and ConfigMaps in any namespace without a grant on them
	// (--trusted-namespace: the platform team's central route namespace).
	TrustedNamespaces []string
	// Routes is what the controller remembers of its routes between
	// reconciles (nil = a new one).
	Routes *RouteState

	// Caches, when set, built every informer (informer.CacheCurrency):
	// reconciles wait while one is not current, and every route is queued
	// when they are current again after a cut.
	Caches *informer.CacheCurrency

	// PodCacheIdle is how long a pod cache (one per namespace and
	// selector) outlives the last route reading it (0 =
	// informer.DefaultPodCacheIdle).
	PodCacheIdle time.Duration

	// out writes (or, previewing, pretends to write) the routes' keys.
	out OutputWriter
	// preview: the reconcile only looks (Preview): nothing is created,
	// changed or reported as changed.
	preview bool

	discovery *discovery.Reader
	// fallback is the FailOpen selector routes' fallback Service.
	fallback *fallbackService
	// consumers is the consumers' served state (the consumers step).
	consumers *consumers
	// pods are the per-selector pod caches (nil: none, previews).
	pods *informer.PodCaches
	// sink is out when it is the real writer (ConfigMap events ask it
	// what changed).
	sink      *sink.Writer
	cmChanges *informer.ConfigMapChanges
	// initial is the initial sync the workers wait for (nil: none).
	initial *initialSync
	// scaler wakes and idles scale-to-zero targets (scaletozero.go).
	scaler *scaler.Scaler
}

// OutputWriter is how the reconcile changes the consumers' ConfigMaps:
// sink.Writer writes, sink.DryRun reads the live content and runs the same
// guards (grant, the key guard, size) without writing (Preview).
type OutputWriter interface {
	ApplyRecorded(ctx context.Context, routeNS string, outputs []compiler.Output, guard sink.Guard, record func(cm string, sums map[string]sink.Sum)) ([]sink.Outcome, error)
	Remove(ctx context.Context, routeNS string, keys map[string][]string, guard sink.Guard) ([]sink.Outcome, error)
	Check(ctx context.Context, routeNS string, keys map[string][]string, guard sink.Guard) ([]sink.Outcome, error)
}

// state is one reconcile's working set, passed along the steps.
type state struct {
	started time.Time            // the reconcile's start
	route   *v1alpha1.ModelRoute // live object; its Status is patched at the end
	spec    *v1alpha1.ModelRoute // validated, defaulted; read for its name, namespace and spec only
	snap    compiler.Snapshot
	// inputs are what the compile reads of the cluster besides the
	// snapshot (the read step).
	inputs compileInputs
	// result is the compile's: the outputs and the route's keys (with
	// nothing to render, the keys alone).
	result compiler.Result
	// fallback is the VIP of the route's owned fallback Service (FailOpen
	// with selector discovery), fed into the snapshot's backend-svc tier.
	fallback *compiler.ServiceVIP
	// unwatched are the namespaces the route references that the
	// controller does not watch (checkNamespaces).
	unwatched map[string]bool
	// noRender: a step found that nothing can be rendered now (an
	// unwatched namespace, an ungranted Service, no backends, a failed
	// compile): the later render steps pass, and the outputs step only
	// checks what the ConfigMaps hold in the route's way.
	noRender bool
	// written and removed are what the outputs step's writes came to.
	written, removed []sink.Outcome
	// problems keep the route from Ready; a reconcile collects every one
	// it can see before it reports (report).
	problems []problem
	// arrive, when set, is called as the route reaches its write (the
	// initial sync's count).
	arrive func()
	// epoch is the cache currency's when the reconcile began
	// (CacheCurrency.Current).
	epoch uint64
	// previewWarnings are what a preview cannot know before the
	// controller acts (e.g. the VIP of a Service it would create).
	previewWarnings []string
	// reports are the served reports of the route's nginx consumer pods
	// (the consumers step), which carry the engines' demand (scale to
	// zero).
	reports []scaler.Report
	// requeueAfter, when > 0, asks for another reconcile this much later
	// with no change (the scale-to-zero idle deadline).
	requeueAfter time.Duration
}

// step is one stage of the reconcile. It reads and updates st; stop ends
// the reconcile early (the step has set the status), an error ends it
// too (the workqueue retries, unless it is terminal).
type step struct {
	name string
	run  func(context.Context, *state) (stop bool, err error)
}

// steps are the reconcile's stages in order. Reconcile runs them between
// the finalizer and the status patch; Preview runs the same list with the
// dry-run writer.
func (r *Reconciler) steps() []step {
	return []step{
		{"validate spec", r.reconcileSpec},
		{"fallback Service", r.reconcileFallback},
		{"watched namespaces", r.checkNamespaces},
		{"Service grants", r.checkServiceGrants},
		{"discovery", r.reconcileDiscovery},
		{"compile inputs", r.readCompileInputs},
		{"compile", r.reconcileCompile},
		{"outputs", r.reconcileOutputs},
		{"consumers", r.reconcileConsumers},
		{"scale to zero", scaleStep{r}.run},
	}
}

// runSteps runs the steps over st, then sets Ready from the problems they
// collected.
func (r *Reconciler) runSteps(ctx context.Context, st *state) error {
	for _, s := range r.steps() {
		stop, err := s.run(ctx, st)
		if err != nil || stop {
			return err
		}
	}
	report(st)
	return nil
}

// Reconcile implements reconcile.Reconciler: get → finalizer → deferred
// status patch → steps → report.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	r.initial.begin(ctx)
	r.initial.wait(ctx)
	res, err := r.reconcile(ctx, req.NamespacedName, nil)
	if err != nil && ctx.Err() != nil {
		// Shutting down (or leadership lost): the reconcile was cut off,
		// not failed; the next leader reconciles every route anyway.
		ctrl.LoggerFrom(ctx).V(levelDebug).Info("reconcile cut off by shutdown", "err", err.Error())
		return ctrl.Result{}, nil
	}
	return res, err
}

// reconcile is Reconcile; arrive (when not nil) is called when the route
// reaches its write (the initial sync holds the writes until every route
// has).
func (r *Reconciler) reconcile(ctx context.Context, key types.NamespacedName, arrive func()) (ctrl.Result, error) {
	return r.reconcileRV(ctx, key, arrive, nil)
}

// reconcileRV is reconcile; rv, when not nil, is set to the route's
// resourceVersion after the reconcile's own writes ("" when it is gone).
func (r *Reconciler) reconcileRV(ctx context.Context, key types.NamespacedName, arrive func(), rv *string) (_ ctrl.Result, retErr error) {
	// Nothing is read for a write while a cache is not current (a cut from
	// the API server); epoch tells whether one began since.
	if err := r.Caches.Wait(ctx); err != nil {
		return ctrl.Result{}, err
	}
	epoch := r.Caches.Epoch()
	req := ctrl.Request{NamespacedName: key}
	route := &v1alpha1.ModelRoute{}
	if err := r.Client.Get(ctx, req.NamespacedName, route); err != nil {
		if apierrors.IsNotFound(err) {
			r.Routes.Forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("get route: %w", err)
	}
	route, err := r.currentRoute(ctx, route)
	if err != nil {
		return ctrl.Result{}, err
	}
	// Every write below (finalizer, status) leaves route at the
	// resourceVersion it produced: the next reconcile's read must show it.
	read := route.ResourceVersion
	defer func() {
		if route.ResourceVersion != read {
			r.Routes.writes.set(key, route.ResourceVersion)
		}
	}()
	if !route.DeletionTimestamp.IsZero() {
		if arrive != nil {
			arrive() // its removals are writes too
		}
		return ctrl.Result{}, r.reconcileDelete(ctx, route)
	}
	if err := r.ensureFinalizer(ctx, route); err != nil {
		return ctrl.Result{}, err
	}
	orig := route.DeepCopy()
	defer func() {
		if !r.Caches.Current(epoch) {
			// Read before a cut: not written; every route is queued when
			// the caches are current again.
			ctrl.LoggerFrom(ctx).V(levelDebug).Info("caches not current since the reconcile began; not writing its status")
			retErr = nil
			if rv != nil {
				*rv = route.ResourceVersion
			}
			return
		}
		retErr = r.patchStatus(ctx, orig, route, retErr)
		if rv != nil {
			*rv = route.ResourceVersion
		}
	}()
	st := &state{route: route, started: time.Now(), arrive: arrive, epoch: epoch}
	err = r.runSteps(ctx, st)
	return ctrl.Result{RequeueAfter: st.requeueAfter}, err
}

// currentRoute is the cached route, or the live one when the cache has not
// caught up with our last write of it (routeWrites): the status patch is
// computed against the route it reads, and a stale one would leave out the
// fields the stale copy already shows as wanted.
func (r *Reconciler) currentRoute(ctx context.Context, cached *v1alpha1.ModelRoute) (*v1alpha1.ModelRoute, error) {
	key := client.ObjectKeyFromObject(cached)
	rv := r.Routes.writes.get(key)
	if rv == "" || rv == cached.ResourceVersion || r.APIReader == nil {
		return cached, nil
	}
	live := &v1alpha1.ModelRoute{}
	if err := r.APIReader.Get(ctx, key, live); err != nil {
		if apierrors.IsNotFound(err) {
			return cached, nil // going: the cache learns it next
		}
		return nil, fmt.Errorf("get route around the cache: %w", err)
	}
	if live.ResourceVersion == cached.ResourceVersion {
		// The cache has caught up (someone wrote the route after us).
		r.Routes.writes.set(key, "")
		return cached, nil
	}
	// The cache is behind: until it shows this version, read around it.
	r.Routes.writes.set(key, live.ResourceVersion)
	ctrl.LoggerFrom(ctx).V(levelDebug).Info("the cached route is behind our last write of it; read around the cache",
		"cached", cached.ResourceVersion, "live", live.ResourceVersion)
	return live, nil
}

// patchStatus writes status once, only when it changed, and emits an event
// when the Ready condition changed. A retryable error is reflected as
// Reconciling=True; a terminal one was already turned into a condition.
func (r *Reconciler) patchStatus(ctx context.Context, orig, route *v1alpha1.ModelRoute, retErr error) error {
	if retErr != nil && !errors.Is(retErr, reconcile.TerminalError(nil)) {
		markRetrying(route, retErr)
	}
	if !(inInitialSync(ctx) && firstReady(orig, route)) {
		r.emitTransition(orig, route)
	}
	key := client.ObjectKeyFromObject(route)
	routeSeries.Set(key, routemetrics.Backends, float64(route.Status.Backends))
	routeSeries.Set(key, routemetrics.CartPeers, float64(route.Status.CartPeers))
	if equality.Semantic.DeepEqual(orig.Status, route.Status) {
		return retErr
	}
	if err := r.Client.Status().Patch(ctx, route, dropRetiredStatus{client.MergeFrom(orig)}); err != nil && !apierrors.IsNotFound(err) {
		return errors.Join(retErr, fmt.Errorf("patch status: %w", err))
	}
	ctrl.LoggerFrom(ctx).V(levelDebug).Info("status updated", "backends", route.Status.Backends, "ready", readyReason(route))
	return retErr
}

// retiredStatusFields are status fields earlier versions wrote and this
// one does not. The status schema preserves unknown fields, so nothing
// else would remove them: every status patch nulls them.
// backendEndpoints: the endpoint list changed at every rollout step and
// made every route write its status; the endpoints are in the ConfigMap.
var retiredStatusFields = []string{"backendEndpoints"}

// dropRetiredStatus adds the removal of retiredStatusFields to a merge
// patch of the status.
type dropRetiredStatus struct{ client.Patch }

func (p dropRetiredStatus) Data(obj client.Object) ([]byte, error) {
	b, err := p.Patch.Data(obj)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	st, _ := m["status"].(map[string]any)
	if st == nil {
		st = map[string]any{}
		m["status"] = st
	}
	for _, f := range retiredStatusFields {
		st[f] = nil
	}
	return json.Marshal(m)
}

func (r *Reconciler) ensureFinalizer(ctx context.Context, route *v1alpha1.ModelRoute) error {
	if controllerutil.ContainsFinalizer(route, Finalizer) {
		return nil
	}
	orig := route.DeepCopy()
	controllerutil.AddFinalizer(route, Finalizer)
	if err := r.Client.Patch(ctx, route, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("add finalizer: %w", err)
	}
	return nil
}
