package controller

// This file: the route's ConfigMap keys. reconcileOutputs writes the
// rendered outputs and removes the keys the route no longer renders,
// reconcileDelete removes them all on deletion; the key bookkeeping (owned
// keys in memory and in status) serves both.

import (
	"context"
	"fmt"
	"slices"
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

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
