package sink

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DefaultBatchWindow is how long the writer of a ConfigMap gathers the
// renders of the routes sharing it before sending them as one patch. One
// EndpointSlice or rollout event reaches many routes within milliseconds,
// and each used to patch (and have the API server send to every watcher)
// the whole shared ConfigMap — 1000 routes in 10 ConfigMaps meant 1000
// writes of about 300 KB. 20 ms gathers one informer burst, and adds little
// to a change-to-served path whose next step, the reload sidecar's
// debounce, is 250 ms.
const DefaultBatchWindow = 20 * time.Millisecond

// request is one route's change to one ConfigMap, waiting in a batch.
type request struct {
	routeNS string
	change  changeFunc
	done    chan result
}

// result is what a request's write came to.
type result struct {
	state     State
	renderErr error
	blocked   []KeyError
	err       error
}

// cmWriter is the one writer of a ConfigMap: it batches requests and
// knows the content (content.go).
type cmWriter struct {
	mu        sync.Mutex
	pending   []*request
	scheduled bool

	write sync.Mutex // serialises the writes of this ConfigMap; guards the rest
	// content is the ConfigMap as our last read or write left it (never
	// modified: replaced).
	content *corev1.ConfigMap
	// superseded are resourceVersions known to be older than content's:
	// the ones our writes were based on, and stale reads a patch test
	// refused. A cache still showing one of them is behind us.
	superseded map[string]bool
	// ours are the resourceVersions our patches produced.
	ours map[string]bool
	// changes are the keys changed since the last Seen.
	changes Changes
}

func (w *Writer) cmWriter(ref string) *cmWriter {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cms == nil {
		w.cms = map[string]*cmWriter{}
	}
	cw, ok := w.cms[ref]
	if !ok {
		cw = &cmWriter{}
		w.cms[ref] = cw
	}
	return cw
}

// submit queues one route's change of ref and waits for the batch it goes
// out with.
func (w *Writer) submit(ctx context.Context, ref, routeNS string, change changeFunc) result {
	cw := w.cmWriter(ref)
	req := &request{routeNS: routeNS, change: change, done: make(chan result, 1)}
	cw.mu.Lock()
	cw.pending = append(cw.pending, req)
	lead := !cw.scheduled
	cw.scheduled = true
	cw.mu.Unlock()
	if lead {
		// The batch outlives a cancelled request: other routes wait on it.
		fctx := context.WithoutCancel(ctx)
		go func() {
			time.Sleep(w.Window)
			w.flush(fctx, ref, cw)
		}()
	}
	select {
	case r := <-req.done:
		return r
	case <-ctx.Done():
		return result{err: ctx.Err()}
	}
}

// flush writes everything pending for ref.
func (w *Writer) flush(ctx context.Context, ref string, cw *cmWriter) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cw.write.Lock()
	defer cw.write.Unlock()
	cw.mu.Lock()
	batch := cw.pending
	cw.pending, cw.scheduled = nil, false
	cw.mu.Unlock()
	w.Batches.Add(1)
	for len(batch) > 0 {
		batch = w.round(ctx, ref, cw, batch)
	}
}

// round writes the requests of batch whose changes do not touch the same
// key as an earlier one, in one patch, and returns the rest for the next
// round (which reads the content this round left: a second claimant of a
// new key sees the first one's mark).
func (w *Writer) round(ctx context.Context, ref string, cw *cmWriter, batch []*request) (rest []*request) {
	key, err := objectKey(ref)
	if err != nil {
		finish(batch, result{err: err})
		return nil
	}
	fresh := false
	var lastErr error
	err = wait.ExponentialBackoffWithContext(ctx, conflictBackoff, func(ctx context.Context) (bool, error) {
		cm, err := w.read(ctx, key, cw, fresh)
		if r, final := settled(err); final {
			if r.state == Missing {
				w.forgetLocked(cw)
			}
			finish(batch, r)
			rest = nil
			return true, nil
		}
		if err != nil {
			lastErr = fmt.Errorf("get configmap %s: %w", key, err)
			return false, nil
		}
		// Decide each request on the same content; the first to touch a
		// key takes it in this round.
		var (
			in        []*request
			res       = map[*request]result{}
			set       = map[string]*string{}
			exclusive []string
		)
		rest = nil
		for _, req := range batch {
			if !Granted(cm, req.routeNS, w.Trusted) {
				res[req] = result{state: NotPermitted}
				continue
			}
			ch, err := req.change(cm)
			if err != nil {
				res[req] = result{state: RenderFailed, renderErr: err, blocked: ch.blocked}
				continue
			}
			if slices.ContainsFunc(slices.Collect(maps.Keys(ch.set)), func(k string) bool { _, taken := set[k]; return taken }) {
				rest = append(rest, req)
				continue
			}
			maps.Copy(set, ch.set)
			exclusive = append(exclusive, ch.exclusive...)
			r := result{state: Unchanged, blocked: ch.blocked}
			if len(ch.set) > 0 {
				r.state = Written
				in = append(in, req)
			}
			res[req] = r
		}
		if len(set) == 0 {
			finishEach(res)
			return true, nil
		}
		if size, grows := sizeAfter(cm, set); grows && size > MaxSize {
			// Attribute the refusal to the routes it concerns: their
			// changes are written one by one (the others still fit).
			w.oneByOne(ctx, ref, cw, in, res)
			return true, nil
		}
		err = w.patchBatch(ctx, cm, set, exclusive, cw)
		switch {
		case err == nil:
			finishEach(res)
			return true, nil
		case apierrors.IsConflict(err) || patchNotApplicable(err):
			// Our content was behind: read the truth and decide again.
			w.Conflicts.Add(1)
			cw.supersede(cm.ResourceVersion)
			fresh, lastErr = true, err
			return false, nil
		case apierrors.IsInvalid(err):
			// One of the changes makes the ConfigMap invalid: write them
			// one by one so the refusal reaches its route alone.
			w.oneByOne(ctx, ref, cw, in, res)
			return true, nil
		}
		if r, final := settled(err); final {
			if r.state == Missing {
				w.forgetLocked(cw)
			}
			finish(batch, r)
			rest = nil
			return true, nil
		}
		lastErr = fmt.Errorf("patch configmap %s: %w", key, err)
		return false, nil
	})
	if err != nil {
		if lastErr == nil {
			lastErr = err
		}
		finish(batch, result{err: lastErr})
		return nil
	}
	return rest
}

// oneByOne writes the requests in each on its own (the unbatched path),
// then answers every request of res.
func (w *Writer) oneByOne(ctx context.Context, ref string, cw *cmWriter, in []*request, res map[*request]result) {
	for _, req := range in {
		st, rerr, blocked, err := w.updateLocked(ctx, ref, cw, req.routeNS, req.change)
		res[req] = result{state: st, renderErr: rerr, blocked: blocked, err: err}
	}
	finishEach(res)
}

// patchBatch sends set as one per-key compare-and-swap patch. A key added
// where the content showed none is guarded by the resourceVersion (JSON
// patch cannot test absence): a stale read fails instead of overwriting a
// key someone else just added, so no fresh read is needed before adding.
func (w *Writer) patchBatch(ctx context.Context, cm *corev1.ConfigMap, set map[string]*string, exclusive []string, cw *cmWriter) error {
	for k, v := range set {
		if _, had := cm.Data[k]; v != nil && !had && !slices.Contains(exclusive, k) {
			exclusive = append(exclusive, k)
		}
	}
	return w.patch(ctx, cm, set, exclusive, cw)
}

// patch sends set, decided on cm, as one per-key compare-and-swap patch
// (exclusive: absent keys whose addition tests the resourceVersion) and
// records the write. The response is requested as metadata only: the
// ConfigMap is not sent back and decoded for nothing.
func (w *Writer) patch(ctx context.Context, cm *corev1.ConfigMap, set map[string]*string, exclusive []string, cw *cmWriter) error {
	var p client.Patch
	b, ok, err := keyPatch(cm.ResourceVersion, cm.Data, set, exclusive)
	if err == nil && !ok {
		b, err = mergePatch(cm.ResourceVersion, set)
		p = client.RawPatch(mergePatchType, b)
	} else {
		p = client.RawPatch(jsonPatch, b)
	}
	if err != nil {
		return err
	}
	meta := &metav1.PartialObjectMetadata{}
	meta.SetGroupVersionKind(configMapGVK)
	meta.Namespace, meta.Name = cm.Namespace, cm.Name
	if err := w.Client.Patch(ctx, meta, p); err != nil {
		return err
	}
	cw.wrote(cm, set, meta.ResourceVersion)
	return nil
}

// settled maps an API error that ends the batch for every request in it:
// the ConfigMap is gone, or the controller may not use it.
func settled(err error) (result, bool) {
	switch {
	case apierrors.IsNotFound(err):
		return result{state: Missing}, true
	case apierrors.IsForbidden(err):
		return result{state: Forbidden, renderErr: err}, true
	}
	return result{}, false
}

func finish(batch []*request, r result) {
	for _, req := range batch {
		req.done <- r
	}
}

func finishEach(res map[*request]result) {
	for req, r := range res {
		req.done <- r
	}
}

// applyBatched is Apply's path with a batch window: every ConfigMap's
// change is submitted at once, then awaited.
func (w *Writer) applyBatched(ctx context.Context, order []string, keys map[string][]string, changes map[string]changeFunc, routeNS string) ([]Outcome, []error) {
	results := make([]result, len(order))
	var wg sync.WaitGroup
	for i, ref := range order {
		wg.Go(func() { results[i] = w.submit(ctx, ref, routeNS, changes[ref]) })
	}
	wg.Wait()
	var res []Outcome
	var errs []error
	for i, ref := range order {
		r := results[i]
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		res = append(res, Outcome{ConfigMap: ref, State: r.state, Keys: keys[ref], Err: r.renderErr, Blocked: r.blocked})
	}
	return res, errs
}
