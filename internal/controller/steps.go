package controller

import (
	"context"
	"errors"
	"fmt"
	"github.com/modelsphere/autoconfig/schema/routespec"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// reconcileSpec validates and defaults the spec, once per generation.
// An invalid spec is terminal: only a new generation can fix it.
func (r *Reconciler) reconcileSpec(ctx context.Context, st *state) (bool, error) {
	spec, err := r.specs.validate(r.Validator, st.route)
	if err == nil {
		st.spec = spec
		return false, nil
	}
	var inv *schema.InvalidError
	if !errors.As(err, &inv) {
		return false, fmt.Errorf("validate spec: %w", err)
	}
	msgs := make([]string, len(inv.Problems))
	for i, p := range inv.Problems {
		msgs[i] = p.Message
		if p.Path != "" {
			msgs[i] = p.Path + ": " + p.Message
		}
	}
	markStalled(st.route, ReasonInvalidSpec, strings.Join(msgs, "; "))
	return true, reconcile.TerminalError(fmt.Errorf("invalid spec: %w", err))
}

// reconcileDiscovery builds the endpoint snapshot. No backends stops here:
// the last good output stays in place (an empty list is never written).
func (r *Reconciler) reconcileDiscovery(ctx context.Context, st *state) (bool, error) {
	snap, err := r.discovery.Snapshot(ctx, st.spec)
	var pe *discovery.PortError
	if errors.As(err, &pe) {
		markStalled(st.route, ReasonPortNotDerivable, pe.Error())
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("discover: %w", err)
	}
	if snap.BackendService == nil {
		snap.BackendService = st.fallback
	}
	st.snap = snap
	st.route.Status.CartPeers = int32(len(snap.CartPods))
	if len(snap.Backends) == 0 {
		markWaiting(st.route, ReasonNoBackends, fmt.Sprintf(
			"no %s backends found for %s; keeping the last written output (%d endpoints)",
			readyWord(st.spec.Spec.Discovery), discoverySource(st.spec), st.route.Status.Backends))
		return true, nil
	}
	return false, nil
}

// reconcileCompile renders the outputs from the validated spec and the
// snapshot (pure Go; no CUE here).
func (r *Reconciler) reconcileCompile(ctx context.Context, st *state) (bool, error) {
	compile := r.Compile
	if compile == nil {
		compile = compiler.Compile
	}
	res, err := compile(compilerRoute(st.spec), st.snap, r.CompileOptions)
	if errors.Is(err, compiler.ErrNoBackends) {
		markWaiting(st.route, ReasonNoBackends, err.Error())
		return true, nil
	}
	if err != nil {
		// The inputs come from the spec and the cluster, both watched: a
		// change re-renders, a timer would not help.
		markStalled(st.route, ReasonCompileFailed, err.Error())
		return true, nil
	}
	st.result = res
	return false, nil
}

// reconcileOutputs writes the outputs, removes keys the route no longer
// renders and records the written backends.
func (r *Reconciler) reconcileOutputs(ctx context.Context, st *state) (bool, error) {
	key := client.ObjectKeyFromObject(st.route)
	now := map[string][]string{}
	for _, o := range st.result.Outputs {
		now[o.ConfigMap] = append(now[o.ConfigMap], o.Key)
	}
	prev, known := r.owned.get(key)
	if !known && len(st.route.Status.Outputs) > 0 {
		// First reconcile in this process: what an earlier one wrote is in
		// status (the spec may have changed while no controller ran).
		prev, known = ownedFromStatus(st.route.Status.Outputs), true
	}
	// Until the stale keys are removed the route owns both sets: a failed
	// write or removal leaves them listed, in memory and in status, for
	// the next attempt.
	pending := unionKeys(prev, now)
	r.owned.set(key, pending)
	st.route.Status.Outputs = statusOutputs(pending)

	outcomes, err := r.writer.Apply(ctx, st.route.Namespace, st.result.Outputs)
	if err != nil {
		return false, fmt.Errorf("write outputs: %w", err)
	}
	log := ctrl.LoggerFrom(ctx)
	for _, o := range outcomes {
		configMapWrites.WithLabelValues(string(o.State)).Inc()
		if o.State == sink.Written {
			log.V(levelDebug).Info("wrote configmap", "configmap", o.ConfigMap, "keys", o.Keys)
		}
	}
	if known {
		if stale := staleKeys(prev, now); len(stale) > 0 {
			if _, err := r.writer.Remove(ctx, st.route.Namespace, stale); err != nil {
				return false, fmt.Errorf("remove keys no longer rendered: %w", err)
			}
			log.Info("removed keys the route no longer renders", "keys", stale)
		}
	}
	r.owned.set(key, now)
	st.route.Status.Outputs = statusOutputs(now)

	written := false
	var missing, forbidden, failed []string
	for _, o := range outcomes {
		switch o.State {
		case sink.Written, sink.Unchanged:
			written = true
		case sink.Missing:
			missing = append(missing, o.ConfigMap)
		case sink.NotPermitted:
			forbidden = append(forbidden, o.ConfigMap)
		case sink.RenderFailed:
			failed = append(failed, o.String())
		}
	}
	if written {
		st.route.Status.Backends = int32(len(st.snap.Backends))
		st.route.Status.BackendEndpoints = hostPorts(st.snap.Backends)
	}
	switch {
	case len(forbidden) > 0:
		markStalled(st.route, ReasonNotPermitted, fmt.Sprintf(
			"ConfigMap %s is in another namespace and does not allow routes from %q: add %q to its annotation %s (or \"*\"); nothing was written there",
			strings.Join(forbidden, ", "), st.route.Namespace, st.route.Namespace, sink.AllowedNamespacesAnnotation))
		return true, nil
	case len(missing) > 0:
		markStalled(st.route, ReasonOutputConfigMapMissing, fmt.Sprintf(
			"ConfigMap %s does not exist; autoconfig never creates ConfigMaps (the consumer's chart does) and writes as soon as it appears",
			strings.Join(missing, ", ")))
		return true, nil
	case len(failed) > 0:
		markStalled(st.route, ReasonRenderFailed, strings.Join(failed, "; "))
		return true, nil
	}
	return false, nil
}

// reconcileDelete removes the route's keys, then the finalizer. A missing
// ConfigMap does not block deletion. The CART config.yaml is left as it is:
// the CART ConfigMap is per model and CART refuses an empty workers list, so
// the CART chart's uninstall removes it (docs/controller.md).
func (r *Reconciler) reconcileDelete(ctx context.Context, route *v1alpha1.ModelRoute) error {
	if !controllerutil.ContainsFinalizer(route, Finalizer) {
		return nil
	}
	key := client.ObjectKeyFromObject(route)
	keys := routeKeys(route)
	// Also what this process or, across restarts, status says the route
	// wrote: the spec may name other keys by now.
	prev, _ := r.owned.get(key)
	keys = unionKeys(keys, staleKeys(unionKeys(prev, ownedFromStatus(route.Status.Outputs)), keys))
	outcomes, err := r.writer.Remove(ctx, route.Namespace, keys)
	if err != nil {
		return fmt.Errorf("remove route keys: %w", err)
	}
	ctrl.LoggerFrom(ctx).Info("removed route keys", "outcomes", fmt.Sprint(outcomes))
	if err := r.cleanupFallbackService(ctx, route); err != nil {
		return err
	}
	orig := route.DeepCopy()
	controllerutil.RemoveFinalizer(route, Finalizer)
	if err := r.Client.Patch(ctx, route, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("remove finalizer: %w", err))
	}
	r.forget(key)
	return nil
}

// routeKeys are the keys a route's spec owns (compiler.OwnedKeys: from the
// spec alone, no validation, no endpoints), so even a route whose spec
// became invalid can be cleaned up. The CART config.yaml is not included
// (see reconcileDelete).
func routeKeys(route *v1alpha1.ModelRoute) map[string][]string {
	keys := map[string][]string{}
	for _, k := range compiler.OwnedKeys(compilerRoute(route)) {
		keys[k.ConfigMap] = append(keys[k.ConfigMap], k.Key)
	}
	return keys
}

// compilerRoute is the compiler's view of a route.
func compilerRoute(route *v1alpha1.ModelRoute) *compiler.Route {
	return &compiler.Route{Name: route.Name, Namespace: route.Namespace, Spec: route.Spec}
}

// staleKeys are keys in prev that now does not render. The CART
// config.yaml is never removed (per-model ConfigMap owned by the CART chart).
func staleKeys(prev, now map[string][]string) map[string][]string {
	out := map[string][]string{}
	for cm, ks := range prev {
		for _, k := range ks {
			if k != compiler.CartKey && !slices.Contains(now[cm], k) {
				out[cm] = append(out[cm], k)
			}
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// unionKeys merges two ConfigMap → keys maps into a new one.
func unionKeys(a, b map[string][]string) map[string][]string {
	out := make(map[string][]string, len(a)+len(b))
	for _, m := range []map[string][]string{a, b} {
		for cm, ks := range m {
			for _, k := range ks {
				if !slices.Contains(out[cm], k) {
					out[cm] = append(out[cm], k)
				}
			}
		}
	}
	return out
}

// statusOutputs is m in status form, sorted (so an unchanged set never
// makes a status write).
func statusOutputs(m map[string][]string) []v1alpha1.OutputKeys {
	out := make([]v1alpha1.OutputKeys, 0, len(m))
	for cm, ks := range m {
		if len(ks) == 0 {
			continue
		}
		ks = slices.Clone(ks)
		slices.Sort(ks)
		out = append(out, v1alpha1.OutputKeys{ConfigMap: cm, Keys: slices.Compact(ks)})
	}
	slices.SortFunc(out, func(a, b v1alpha1.OutputKeys) int { return strings.Compare(a.ConfigMap, b.ConfigMap) })
	if len(out) == 0 {
		return nil
	}
	return out
}

func ownedFromStatus(outs []v1alpha1.OutputKeys) map[string][]string {
	m := make(map[string][]string, len(outs))
	for _, o := range outs {
		m[o.ConfigMap] = append(m[o.ConfigMap], o.Keys...)
	}
	return m
}

func hostPorts(eps []compiler.Endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = discovery.HostPort(e)
	}
	return out
}

func readyWord(d v1alpha1.Discovery) string {
	if d.IncludeNotReady {
		return "usable"
	}
	return "ready"
}

func discoverySource(route *v1alpha1.ModelRoute) string {
	d := route.Spec.Discovery
	if d.Service != "" {
		return "Service " + routespec.RefKey(d.Service, route.Namespace)
	}
	return fmt.Sprintf("pods %q in %s", d.Selector, route.Namespace)
}

// specCache holds the validated spec per route UID and generation: CUE is
// evaluated once per spec generation, never per endpoint change.
type specCache struct {
	mu sync.Mutex
	m  map[types.UID]specEntry
}

type specEntry struct {
	name       types.NamespacedName
	generation int64
	spec       *v1alpha1.ModelRoute
	err        error
}

func (c *specCache) validate(v Validator, route *v1alpha1.ModelRoute) (*v1alpha1.ModelRoute, error) {
	c.mu.Lock()
	e, ok := c.m[route.UID]
	c.mu.Unlock()
	if ok && e.generation == route.Generation {
		return e.spec, e.err
	}
	spec, err := v.ValidateObject(route)
	specValidations.Inc()
	var inv *schema.InvalidError
	if err != nil && !errors.As(err, &inv) {
		return nil, err // not cached: may be transient
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[types.UID]specEntry{}
	}
	c.m[route.UID] = specEntry{name: client.ObjectKeyFromObject(route), generation: route.Generation, spec: spec, err: err}
	c.mu.Unlock()
	return spec, err
}

func (c *specCache) forgetName(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for uid, e := range c.m {
		if e.name == key {
			delete(c.m, uid)
		}
	}
}
