// Package sink writes a route's rendered outputs into the consumers'
// existing ConfigMaps.
//
// Rules (SPEC "Rules of writing"): a ConfigMap is never created; only the
// route's own keys are touched; many routes share one ConfigMap without
// clobbering each other; a no-op writes nothing. Writes are JSON merge
// patches of the changed keys only, guarded by the resourceVersion the
// content was rendered from (optimistic concurrency): a conflict re-reads
// the ConfigMap from the API server, re-renders and retries, so an output
// whose rendering depends on the current content (CART config.yaml keeps
// the CART chart's base config) never overwrites a newer base.
package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
)

// AllowedNamespacesAnnotation on a ConfigMap lets routes from other
// namespaces write into it: a comma-separated list of namespaces, or "*".
// A route may always write ConfigMaps in its own namespace.
const AllowedNamespacesAnnotation = "routing.modelsphere.dev/allowed-route-namespaces"

// maxAttempts bounds the conflict retries of one ConfigMap write. Writers in
// this process are serialized per ConfigMap, so conflicts only come from
// other writers (the CART chart, kubectl) or a stale cache; a handful of
// attempts is plenty and a persistent conflict is retried by the workqueue.
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

	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// lock serializes this process's writers of one ConfigMap: concurrent
// reconciles of routes sharing it would otherwise mostly conflict.
func (w *Writer) lock(cm string) func() {
	w.mu.Lock()
	if w.locks == nil {
		w.locks = map[string]*sync.Mutex{}
	}
	l, ok := w.locks[cm]
	if !ok {
		l = &sync.Mutex{}
		w.locks[cm] = l
	}
	w.mu.Unlock()
	l.Lock()
	return l.Unlock
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
// (nil), and patches them with an optimistic lock, retrying conflicts on a
// fresh read. The second result is a render error (state RenderFailed).
func (w *Writer) update(ctx context.Context, ref, routeNS string, change func(map[string]string) (map[string]*string, error)) (State, error, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok {
		return "", nil, fmt.Errorf("configmap reference %q is not ns/name", ref)
	}
	defer w.lock(ref)()
	var reader client.Reader = w.Client
	for attempt := 0; ; attempt++ {
		var cm corev1.ConfigMap
		if err := reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cm); err != nil {
			if apierrors.IsNotFound(err) {
				return Missing, nil, nil
			}
			return "", nil, fmt.Errorf("get configmap %s: %w", ref, err)
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
		patch, err := mergePatch(cm.ResourceVersion, changed)
		if err != nil {
			return "", nil, err
		}
		err = w.Client.Patch(ctx, &cm, client.RawPatch(typesMergePatch, patch))
		switch {
		case err == nil:
			return Written, nil, nil
		case apierrors.IsNotFound(err):
			return Missing, nil, nil
		case apierrors.IsConflict(err) && attempt+1 < maxAttempts && w.APIReader != nil:
			reader = w.APIReader // the cache was behind: read the truth
		default:
			return "", nil, fmt.Errorf("patch configmap %s: %w", ref, err)
		}
	}
}
