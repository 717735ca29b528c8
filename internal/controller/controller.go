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
	"slices"
	"strings"
	"sync"
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

// CompileFunc renders a route (compiler.Compile).
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

	// PodCacheIdle is how long a namespace's pod cache outlives its last
	// selector route (0 = DefaultPodCacheIdle).
	PodCacheIdle time.Duration

	discovery *discovery.Reader
	pods      *podCaches
	applied   appliedTracker
	reports   reportCache
	changes   changeLog
	writer    *sink.Writer
	specs     specCache
	owned     ownership
	waiting   waitSet
}

// state is one reconcile's working set, passed along the steps.
type state struct {
	started time.Time            // the reconcile's start
	route   *v1alpha1.ModelRoute // live object; its Status is patched at the end
	spec    *v1alpha1.ModelRoute // validated, defaulted copy
	snap    compiler.Snapshot
	result  compiler.Result
	// fallback is the VIP of the route's owned fallback Service (FailOpen
	// with selector discovery), fed into the snapshot's backend-svc tier.
	fallback *compiler.ServiceVIP
	// problems keep the route from Ready; a reconcile collects every one
	// it can see before it reports (report).
	problems []problem
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	route := &v1alpha1.ModelRoute{}
	if err := r.Client.Get(ctx, req.NamespacedName, route); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("get route: %w", err)
	}
	if !route.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.reconcileDelete(ctx, route)
	}
	if err := r.ensureFinalizer(ctx, route); err != nil {
		return ctrl.Result{}, err
	}

	orig := route.DeepCopy()
	defer func() { retErr = r.patchStatus(ctx, orig, route, retErr) }()

	st := &state{route: route, started: time.Now()}
	if done, err := r.reconcileSpec(ctx, st); err != nil || done {
		return ctrl.Result{}, err
	}
	if _, err := r.reconcileFallback(ctx, st); err != nil {
		return ctrl.Result{}, err
	}
	// Every problem in the route's way is collected before it reports:
	// unwatched namespaces, a missing Service, no backends, and what the
	// output ConfigMaps say (checked without writing when there is
	// nothing to write).
	unwatched := r.checkNamespaces(st)
	compiled := false
	granted := len(unwatched) == 0
	if granted {
		var err error
		if granted, err = r.checkServiceGrants(ctx, st); err != nil {
			return ctrl.Result{}, err
		}
	}
	if granted {
		found, err := r.reconcileDiscovery(ctx, st)
		if err != nil {
			return ctrl.Result{}, err
		}
		compiled = found && r.reconcileCompile(ctx, st)
	}
	var err error
	if compiled {
		err = r.reconcileOutputs(ctx, st)
	} else {
		err = r.checkOutputs(ctx, st, unwatched)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.reconcileConsumers(ctx, st); err != nil {
		return ctrl.Result{}, err
	}
	report(st)
	return ctrl.Result{}, nil
}

// patchStatus writes status once, only when it changed, and emits an event
// when the Ready condition changed. A retryable error is reflected as
// Reconciling=True; a terminal one was already turned into a condition.
func (r *Reconciler) patchStatus(ctx context.Context, orig, route *v1alpha1.ModelRoute, retErr error) error {
	if retErr != nil && !errors.Is(retErr, reconcile.TerminalError(nil)) {
		markRetrying(route, retErr)
	}
	r.emitTransition(orig, route)
	routeBackends.WithLabelValues(route.Namespace, route.Name).Set(float64(route.Status.Backends))
	routeCartPeers.WithLabelValues(route.Namespace, route.Name).Set(float64(route.Status.CartPeers))
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

// forget drops what the reconciler remembers about a route that is gone.
func (r *Reconciler) forget(key types.NamespacedName) {
	r.applied.forget(key)
	r.changes.forget(key)
	forgetRouteSeries(key.Namespace, key.Name)
	r.owned.set(key, nil)
	r.waiting.set(key, nil)
	r.specs.forgetName(key)
}

// ownership remembers the keys each route last rendered (ConfigMap →
// keys), so a ConfigMap event re-renders only the routes whose keys
// changed, and keys a route stops rendering (renamed route, moved output)
// are removed.
type ownership struct {
	mu sync.Mutex
	m  map[types.NamespacedName]map[string][]string
	// sums: what each of the route's keys held after its last write
	// ("ns/name\x00key" → SHA-256), so the event of its own write is not
	// taken for a change.
	sums map[types.NamespacedName]map[string]sink.Sum
}

// setSums records what the route's keys in cm hold (or are about to hold)
// after a write.
func (o *ownership) setSums(key types.NamespacedName, cm string, sums map[string]sink.Sum) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.sums == nil {
		o.sums = map[types.NamespacedName]map[string]sink.Sum{}
	}
	m := o.sums[key]
	if m == nil {
		m = map[string]sink.Sum{}
		o.sums[key] = m
	}
	for k := range m {
		if strings.HasPrefix(k, cm+"\x00") {
			delete(m, k)
		}
	}
	for k, s := range sums {
		m[cm+"\x00"+k] = s
	}
}

// sumsIn are the Sums of the route's keys in cm as last decided.
func (o *ownership) sumsIn(key types.NamespacedName, cm string) map[string]sink.Sum {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]sink.Sum{}
	for k, s := range o.sums[key] {
		if c, name, ok := strings.Cut(k, "\x00"); ok && c == cm {
			out[name] = s
		}
	}
	return out
}

// keysIn are the route's keys in cm.
func (o *ownership) keysIn(key types.NamespacedName, cm string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.m[key][cm])
}

// ownValue reports whether value is what the route itself last left in
// cm's key.
func (o *ownership) ownValue(key types.NamespacedName, cm, k, value string) bool {
	o.mu.Lock()
	s, ok := o.sums[key][cm+"\x00"+k]
	o.mu.Unlock()
	return ok && s == sink.SumOf(value)
}

func (o *ownership) get(key types.NamespacedName) (map[string][]string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	v, ok := o.m[key]
	return v, ok
}

func (o *ownership) set(key types.NamespacedName, v map[string][]string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if v == nil {
		delete(o.m, key)
		delete(o.sums, key)
		return
	}
	if o.m == nil {
		o.m = map[types.NamespacedName]map[string][]string{}
	}
	o.m[key] = v
}

// waitSet remembers the routes that wait on a ConfigMap's content without
// owning a key that changes (too large, a key held by another route or by
// hand), so any change to that ConfigMap re-renders them.
type waitSet struct {
	mu sync.Mutex
	m  map[string]map[types.NamespacedName]bool // ConfigMap ns/name → routes
}

// set makes route wait on exactly cms.
func (w *waitSet) set(route types.NamespacedName, cms []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for cm, routes := range w.m {
		if routes[route] && !slices.Contains(cms, cm) {
			delete(routes, route)
			if len(routes) == 0 {
				delete(w.m, cm)
			}
		}
	}
	for _, cm := range cms {
		if w.m == nil {
			w.m = map[string]map[types.NamespacedName]bool{}
		}
		if w.m[cm] == nil {
			w.m[cm] = map[types.NamespacedName]bool{}
		}
		w.m[cm][route] = true
	}
}

// on lists the routes waiting on cm.
func (w *waitSet) on(cm string) []types.NamespacedName {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]types.NamespacedName, 0, len(w.m[cm]))
	for r := range w.m[cm] {
		out = append(out, r)
	}
	return out
}
