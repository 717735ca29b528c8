package controller

// This file: the route's ConfigMap keys. reconcileOutputs writes the
// rendered outputs and removes the keys the route no longer renders,
// reconcileDelete removes them all on deletion; the key bookkeeping (owned
// keys in memory and in status) serves both.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/routemetrics"
	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// reconcileOutputs writes the outputs the route may write (keyGuard.write),
// removes keys it no longer renders (only ones with its own mark) and
// records what it holds and what is in its way. With nothing to render it
// only checks (checkOutputs).
func (r *Reconciler) reconcileOutputs(ctx context.Context, st *state) (bool, error) {
	if !r.preview && !r.Caches.Current(st.epoch) {
		// A cut from the API server began since the reconcile read its
		// inputs: they may be stale. Every route is queued when the caches
		// are current again.
		return true, nil
	}
	if st.noRender {
		return false, r.checkOutputs(ctx, st)
	}
	key := client.ObjectKeyFromObject(st.route)
	owners := keyGuard{client: r.Client, trusted: r.TrustedNamespaces}
	guard := owners.write(ctx, st.route, st.result.Keys) // before status.outputs changes below
	st.result.Outputs = owners.dropUnsafeMonitor(ctx, st, st.result.Outputs)
	now := map[string][]string{}
	for _, o := range st.result.Outputs {
		now[o.ConfigMap] = append(now[o.ConfigMap], o.Key)
	}
	prev, known := r.Routes.rendered.get(key)
	if !known && len(st.route.Status.Outputs) > 0 {
		// First reconcile in this process: what an earlier one wrote is in
		// status (the spec may have changed while no controller ran).
		prev, known = ownedFromStatus(st.route.Status.Outputs), true
	}
	// Until the stale keys are removed the route watches both sets: a
	// failed write or removal leaves them listed, in memory and in
	// status, for the next attempt.
	pending := unionKeys(prev, now)
	r.Routes.rendered.set(key, pending)
	st.route.Status.Outputs = statusOutputs(unionKeys(ownedFromStatus(st.route.Status.Outputs), now))

	if st.arrive != nil {
		st.arrive()
	}
	outcomes, err := r.out.ApplyRecorded(ctx, st.route.Namespace, st.result.Outputs, guard,
		func(cm string, sums map[string]sink.Sum) { r.Routes.rendered.setSums(key, cm, sums) })
	if err != nil {
		return false, fmt.Errorf("write outputs: %w", err)
	}
	st.written = outcomes
	log := ctrl.LoggerFrom(ctx)
	if !r.preview {
		blocked := 0
		for _, o := range outcomes {
			configMapWrites.WithLabelValues(string(o.State)).Inc()
			blocked += len(o.Blocked)
		}
		routeSeries.Set(client.ObjectKeyFromObject(st.route), routemetrics.BlockedKeys, float64(blocked))
		r.reportChanges(st, outcomes)
	}
	if known {
		if stale := staleKeys(prev, now); len(stale) > 0 {
			res, err := r.out.Remove(ctx, st.route.Namespace, stale, removeGuard(st.result.Keys.Owner))
			if err != nil {
				return false, fmt.Errorf("remove keys no longer rendered: %w", err)
			}
			st.removed = res
			if !r.preview {
				log.Info("removed keys the route no longer renders", "keys", stale, "outcomes", fmt.Sprint(res))
			}
		}
	}
	r.Routes.rendered.set(key, now)
	st.route.Status.Outputs = statusOutputs(heldKeys(outcomes))
	if r.outcomeProblems(st, outcomes) {
		st.route.Status.Backends = int32(len(st.snap.Backends))
		st.route.Status.CanaryBackends = 0
		if st.spec.Spec.Canary != nil {
			st.route.Status.CanaryBackends = int32(len(st.snap.CanaryBackends))
		}
	}
	return false, nil
}

// checkOutputs reports, without writing, what the output ConfigMaps hold
// in the route's way, for a reconcile that has nothing to write (no
// backends, a missing Service, an unwatched namespace): every problem is
// reported at once. ConfigMaps in unwatched namespaces are skipped (they
// are reported already).
func (r *Reconciler) checkOutputs(ctx context.Context, st *state) error {
	owners := keyGuard{client: r.Client, trusted: r.TrustedNamespaces}
	owners.dropUnsafeMonitor(ctx, st, nil) // only its problem: nothing is written here
	keys := map[string][]string{}
	for _, k := range st.result.Keys.Outputs { // without a render: the keys alone, no peers table
		if ns, _, _ := strings.Cut(k.ConfigMap, "/"); !st.unwatched[ns] {
			keys[k.ConfigMap] = append(keys[k.ConfigMap], k.Key)
		}
	}
	outcomes, err := r.out.Check(ctx, st.route.Namespace, keys, owners.write(ctx, st.route, st.result.Keys))
	if err != nil {
		return fmt.Errorf("check outputs: %w", err)
	}
	st.written = outcomes
	r.outcomeProblems(st, outcomes)
	return nil
}

// heldKeys are the keys that hold the route's render after Apply.
func heldKeys(outcomes []sink.Outcome) map[string][]string {
	out := map[string][]string{}
	for _, o := range outcomes {
		if o.State != sink.Written && o.State != sink.Unchanged {
			continue
		}
		for _, k := range o.Keys {
			if !slices.ContainsFunc(o.Blocked, func(b sink.KeyError) bool { return b.Key == k }) {
				out[o.ConfigMap] = append(out[o.ConfigMap], k)
			}
		}
	}
	return out
}

// outcomeProblems records the problems of the per-ConfigMap outcomes, each
// scoped to the ConfigMaps or keys it holds back, and which ConfigMaps the
// route waits on; written reports whether any output holds the current
// render.
func (r *Reconciler) outcomeProblems(st *state, outcomes []sink.Outcome) (written bool) {
	var missing, forbidden, failed, waitOn []string
	var failedMsgs []string
	for _, o := range outcomes {
		for _, b := range o.Blocked {
			at := o.ConfigMap + "|" + b.Key
			var ce *ConflictError
			var fe *ForeignError
			switch {
			case errors.As(b.Err, &ce):
				st.blockAt(ReasonOutputConflict, ce.Error(), false, at)
			case errors.As(b.Err, &fe):
				st.blockAt(ReasonOutputKeyForeign, fe.Error(), false, at)
			}
		}
		if len(o.Blocked) > 0 {
			waitOn = append(waitOn, o.ConfigMap)
		}
		switch o.State {
		case sink.Written, sink.Unchanged:
			written = written || len(o.Blocked) < len(o.Keys)
		case sink.Missing:
			missing = append(missing, o.ConfigMap)
		case sink.NotPermitted:
			forbidden = append(forbidden, o.ConfigMap)
		case sink.RenderFailed:
			failed = append(failed, o.ConfigMap)
			failedMsgs = append(failedMsgs, o.String())
		case sink.Forbidden:
			ns, _, _ := strings.Cut(o.ConfigMap, "/")
			st.blockAt(ReasonOutputForbidden, fmt.Sprintf(
				"the API server does not let the controller write ConfigMap %s (%v): grant its service account get and patch on configmaps in namespace %s (the Helm chart does for the namespaces in watchNamespaces, or cluster-wide when that is empty)",
				o.ConfigMap, o.Err, ns), false, o.ConfigMap)
		case sink.TooLarge:
			st.blockAt(ReasonOutputTooLarge, o.Err.Error(), false, o.ConfigMap)
			waitOn = append(waitOn, o.ConfigMap)
		case sink.Rejected:
			st.blockAt(ReasonOutputRejected, fmt.Sprintf("the API server refused the write of ConfigMap %s as invalid (%v); nothing was written, and the same write is not sent again until the spec or that ConfigMap changes", o.ConfigMap, o.Err), false, o.ConfigMap)
			waitOn = append(waitOn, o.ConfigMap)
		}
	}
	r.Routes.waiting.set(client.ObjectKeyFromObject(st.route), waitOn)
	if len(forbidden) > 0 {
		st.blockAt(ReasonNotPermitted, fmt.Sprintf(
			"ConfigMap %s is in another namespace and does not allow routes from %q: add %q to its annotation %s (or \"*\"), or run the route in a namespace the controller trusts (--trusted-namespace, Helm value trustedNamespaces); nothing was written there",
			strings.Join(forbidden, ", "), st.route.Namespace, st.route.Namespace, sink.AllowedNamespacesAnnotation), false, forbidden...)
	}
	if len(missing) > 0 {
		st.blockAt(ReasonOutputConfigMapMissing, fmt.Sprintf(
			"ConfigMap %s does not exist; autoconfig never creates ConfigMaps (the consumer's chart does) and writes as soon as it appears",
			strings.Join(missing, ", ")), false, missing...)
	}
	if len(failed) > 0 {
		st.blockAt(ReasonRenderFailed, strings.Join(failedMsgs, "; "), false, failed...)
	}
	return written
}

// reconcileDelete removes the route's keys (only those that carry its
// ownership mark: never a key another route or a person wrote, whatever
// status.outputs lists), then the finalizer. A missing ConfigMap does not
// block deletion. The CART config.yaml is left as it is:
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
	prev, _ := r.Routes.rendered.get(key)
	keys = unionKeys(keys, staleKeys(unionKeys(prev, ownedFromStatus(route.Status.Outputs)), keys))
	// No compile here (the spec may be invalid by now): the mark's name
	// comes from the route itself.
	outcomes, err := r.out.Remove(ctx, route.Namespace, keys, removeGuard(compiler.OwnerRef(route.Namespace, route.Name)))
	if err != nil {
		return fmt.Errorf("remove route keys: %w", err)
	}
	ctrl.LoggerFrom(ctx).Info("removed route keys", "outcomes", fmt.Sprint(outcomes))
	if err := r.fallback.cleanup(ctx, route); err != nil {
		return err
	}
	orig := route.DeepCopy()
	controllerutil.RemoveFinalizer(route, Finalizer)
	if err := r.Client.Patch(ctx, route, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("remove finalizer: %w", err))
	}
	r.Routes.Forget(key)
	return nil
}

// routeKeys are the keys a route's spec owns (compiler.OwnedKeysFor: from
// the spec alone, no validation, no endpoints), so even a route whose spec
// became invalid can be cleaned up. The peers table key is included
// whether or not the ConfigMap declares dynamic peers now (it may have
// when the table was written; removal takes only a key with this route's
// mark). The CART config.yaml is not included (see reconcileDelete).
func routeKeys(route *v1alpha1.ModelRoute) map[string][]string {
	keys := map[string][]string{}
	for _, k := range compiler.OwnedKeysFor(compilerRoute(route), true) {
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
