// Package sink writes a route's rendered outputs into the consumers'
// existing ConfigMaps.
//
// Rules of writing: a ConfigMap is never created; only the
// route's own keys are touched; many routes share one ConfigMap without
// clobbering each other; a no-op writes nothing (rendered bytes are compared
// with the current ones first). Writes are JSON patches of the changed keys
// only, each guarded by a test of the value it was rendered from (per-key
// compare-and-swap): routes sharing a ConfigMap never conflict with each
// other, and an output rendered from the current content (the CART
// config.yaml keeps the CART chart's base config) is re-rendered after a
// concurrent change instead of overwriting it.
package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
)

// AllowedNamespacesAnnotation on a ConfigMap lets routes from other
// namespaces write into it: a comma-separated list of namespaces, or "*".
// A route may always write ConfigMaps in its own namespace.
const AllowedNamespacesAnnotation = "routing.modelsphere.dev/allowed-route-namespaces"

// maxAttempts bounds the retries of one ConfigMap write. Routes sharing a
// ConfigMap do not conflict (per-key patches), so a retry means our cached
// read of our own key was stale or someone else (the CART chart, kubectl)
// changed it; a persistent failure goes back to the workqueue.
const maxAttempts = 8

// State is what happened to one ConfigMap.
type State string

const (
	// Unchanged: every key already held the rendered content; no write.
	Unchanged State = "Unchanged"
	// Written: one patch updated the changed keys.
	Written State = "Written"
	// Missing: the ConfigMap does not exist; nothing was created.
	Missing State = "Missing"
	// NotPermitted: a ConfigMap in another namespace that does not allow
	// the route's namespace; nothing was written.
	NotPermitted State = "NotPermitted"
	// RenderFailed: an output could not be rendered from the current
	// content (e.g. the CART base config is missing); nothing was written.
	RenderFailed State = "RenderFailed"
)

// Outcome is the result for one ConfigMap.
type Outcome struct {
	// ConfigMap is ns/name.
	ConfigMap string
	State     State
	// Keys are the route's keys in this ConfigMap (written or not).
	Keys []string
	// Err explains RenderFailed.
	Err error
}

func (o Outcome) String() string {
	s := fmt.Sprintf("%s %s", o.ConfigMap, o.State)
	if o.Err != nil {
		s += ": " + o.Err.Error()
	}
	return s
}

// Writer writes outputs. Client reads (normally the manager's cache) and
// patches; APIReader reads fresh after a conflict. Safe for concurrent use.
type Writer struct {
	Client    client.Client
	APIReader client.Reader
}

// Permitted says whether a route in routeNS may write cm.
func Permitted(cm *corev1.ConfigMap, routeNS string) bool {
	if cm.Namespace == routeNS {
		return true
	}
	for _, ns := range strings.Split(cm.Annotations[AllowedNamespacesAnnotation], ",") {
		ns = strings.TrimSpace(ns)
		if ns == "*" || (ns != "" && ns == routeNS) {
			return true
		}
	}
	return false
}

// Apply writes outputs (grouped by ConfigMap, in first-seen order) for a
// route in routeNS. The error is for API failures worth a retry; per
// ConfigMap states are in the outcomes.
func (w *Writer) Apply(ctx context.Context, routeNS string, outputs []compiler.Output) ([]Outcome, error) {
	var order []string
	byCM := map[string][]compiler.Output{}
	for _, o := range outputs {
		if _, ok := byCM[o.ConfigMap]; !ok {
			order = append(order, o.ConfigMap)
		}
		byCM[o.ConfigMap] = append(byCM[o.ConfigMap], o)
	}
	var res []Outcome
	var errs []error
	for _, cm := range order {
		outs := byCM[cm]
		keys := make([]string, len(outs))
		for i, o := range outs {
			keys[i] = o.Key
		}
		st, rerr, err := w.update(ctx, cm, routeNS, func(data map[string]string) (map[string]*string, error) {
			changed := map[string]*string{}
			for _, o := range outs {
				cur, ok := data[o.Key]
				var in []byte
				if ok {
					in = []byte(cur)
				}
				b, err := o.Render(in)
				if err != nil {
					return nil, fmt.Errorf("render %s: %w", o.Key, err)
				}
				if !ok || !bytes.Equal(b, in) {
					s := string(b)
					changed[o.Key] = &s
				}
			}
			return changed, nil
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		res = append(res, Outcome{ConfigMap: cm, State: st, Keys: keys, Err: rerr})
	}
	return res, errors.Join(errs...)
}

// Remove deletes keys (ConfigMap "ns/name" → keys) written by a route in
// routeNS. A missing ConfigMap is fine (nothing to remove); a ConfigMap the
// route may not write is left alone (it cannot hold the route's keys).
func (w *Writer) Remove(ctx context.Context, routeNS string, keys map[string][]string) ([]Outcome, error) {
	cms := make([]string, 0, len(keys))
	for cm := range keys {
		cms = append(cms, cm)
	}
	slices.Sort(cms)
	var res []Outcome
	var errs []error
	for _, cm := range cms {
		ks := keys[cm]
		st, _, err := w.update(ctx, cm, routeNS, func(data map[string]string) (map[string]*string, error) {
			changed := map[string]*string{}
			for _, k := range ks {
				if _, ok := data[k]; ok {
					changed[k] = nil
				}
			}
			return changed, nil
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		res = append(res, Outcome{ConfigMap: cm, State: st, Keys: ks})
	}
	return res, errors.Join(errs...)
}

// update reads cm, asks change for the keys to set (non-nil) or delete
// (nil), and patches exactly those keys with a per-key compare-and-swap
// (keyPatch). When the patch finds a key changed underneath (a failed JSON
// patch test is 422 Invalid, a stale resourceVersion 409 Conflict), our read
// was behind: it re-reads from the API server and re-renders, up to
// maxAttempts times with conflictBackoff. The second result is a render
// error (RenderFailed).
func (w *Writer) update(ctx context.Context, ref, routeNS string, change func(map[string]string) (map[string]*string, error)) (State, error, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok {
		return "", nil, fmt.Errorf("configmap reference %q is not ns/name", ref)
	}
	key := client.ObjectKey{Namespace: ns, Name: name}
	var (
		reader    client.Reader = w.Client
		state     State
		renderErr error
		patchErr  error
	)
	err := wait.ExponentialBackoffWithContext(ctx, conflictBackoff, func(ctx context.Context) (bool, error) {
		state, renderErr, patchErr = w.tryUpdate(ctx, reader, key, routeNS, change)
		if patchErr != nil && w.APIReader != nil && (apierrors.IsConflict(patchErr) || apierrors.IsInvalid(patchErr)) {
			reader = w.APIReader // read the truth and redo
			return false, nil
		}
		return true, patchErr
	})
	if wait.Interrupted(err) && patchErr != nil {
		err = patchErr // attempts exhausted on a busy key: back to the workqueue
	}
	if err != nil {
		return "", nil, err
	}
	return state, renderErr, nil
}

// conflictBackoff spaces the attempts of update on a busy key: 5-10ms
// before the first retry, then doubling (jittered, at most 500ms).
var conflictBackoff = wait.Backoff{Steps: maxAttempts, Duration: 5 * time.Millisecond, Factor: 2, Jitter: 1, Cap: 500 * time.Millisecond}

// tryUpdate is one attempt of update: read cm through reader, render,
// patch. The error is a read error (wrapped) or the patch's own error.
func (w *Writer) tryUpdate(ctx context.Context, reader client.Reader, key client.ObjectKey, routeNS string, change func(map[string]string) (map[string]*string, error)) (State, error, error) {
	var cm corev1.ConfigMap
	if err := reader.Get(ctx, key, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return Missing, nil, nil
		}
		return "", nil, fmt.Errorf("get configmap %s: %w", key, err)
	}
	if !Permitted(&cm, routeNS) {
		return NotPermitted, nil, nil
	}
	changed, err := change(cm.Data)
	if err != nil {
		return RenderFailed, err, nil
	}
	if len(changed) == 0 {
		return Unchanged, nil, nil
	}
	if reader != w.APIReader && w.APIReader != nil && addsAbsentKey(cm.Data, changed) {
		// A key absent from the cache is added without a test (JSON
		// patch cannot test absence), so a stale cache would mean a
		// redundant write of content already there: read the truth
		// first. This costs one GET, only when a key first appears.
		return w.tryUpdate(ctx, w.APIReader, key, routeNS, change)
	}
	var p client.Patch
	b, ok, err := keyPatch(cm.Data, changed)
	if err == nil && !ok {
		b, err = mergePatch(cm.ResourceVersion, changed)
		p = client.RawPatch(mergePatchType, b)
	} else {
		p = client.RawPatch(jsonPatch, b)
	}
	if err != nil {
		return "", nil, err
	}
	switch err := w.Client.Patch(ctx, &cm, p); {
	case err == nil:
		return Written, nil, nil
	case apierrors.IsNotFound(err):
		return Missing, nil, nil
	default:
		return "", nil, fmt.Errorf("patch configmap %s: %w", key, err)
	}
}

// addsAbsentKey reports whether changed sets a key that current lacks.
func addsAbsentKey(current map[string]string, changed map[string]*string) bool {
	for k, v := range changed {
		if _, had := current[k]; v != nil && !had {
			return true
		}
	}
	return false
}
