package sink

import (
	"context"
	"fmt"
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

// submit queues req with its ConfigMap's writer and waits for the batch it
// goes out with.
func (w *Writer) submit(ctx context.Context, req *request) result {
	cw := w.cmWriter(req.ref)
	req.done = make(chan result, 1)
	cw.mu.Lock()
	cw.pending = append(cw.pending, req)
	lead := !cw.scheduled
	cw.scheduled = true
	cw.mu.Unlock()
	if lead {
		// The batch outlives a cancelled request: other routes wait on it.
		fctx := context.WithoutCancel(ctx)
		if w.Window == 0 {
			// No window to wait: the lead writes the batch itself (its
			// own request among them) once the writer is free.
			w.flush(fctx, req.ref, cw)
			return <-req.done
		}
		go func() {
			time.Sleep(w.Window)
			w.held()
			w.flush(fctx, req.ref, cw)
		}()
	}
	select {
	case r := <-req.done:
		return r
	case <-ctx.Done():
		return result{retry: ctx.Err()}
	}
}

// Hold makes every batch wait, after its window, until release is called
// (or max has passed): the changes that reach a ConfigMap's writer in the
// meantime all go out in that batch. The controller holds the batches
// while the initial sync renders every route, so that each ConfigMap is
// written once instead of once per few routes. Only one hold is in effect;
// release is idempotent. A zero-window Writer does not hold.
func (w *Writer) Hold(max time.Duration) (release func()) {
	ch := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(ch) }) }
	timer := time.AfterFunc(max, open)
	w.mu.Lock()
	w.hold = ch
	w.mu.Unlock()
	return func() {
		timer.Stop()
		open()
	}
}

// held waits for the current hold's release, if any.
func (w *Writer) held() {
	w.mu.Lock()
	ch := w.hold
	w.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

// flush writes everything pending for ref, in rounds.
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
	w.rounds(ctx, ref, cw, batch)
}

// rounds writes batch in rounds until every request is answered.
func (w *Writer) rounds(ctx context.Context, ref string, cw *cmWriter, batch []*request) {
	for len(batch) > 0 {
		batch = w.round(ctx, ref, cw, batch)
	}
}

// round decides the requests of batch on the same content (decide) and
// writes the changes of those that do not touch a key an earlier one took
// in one per-key compare-and-swap patch; it answers them and returns the
// rest for the next round. When the patch finds the content changed
// underneath (a failed JSON patch test is 422 Invalid, a stale
// resourceVersion 409 Conflict), our read was behind: the batch is read
// from the API server and decided again, up to maxAttempts times with
// conflictBackoff. The caller holds cw.write.
func (w *Writer) round(ctx context.Context, ref string, cw *cmWriter, batch []*request) (rest []*request) {
	key, err := objectKey(ref)
	if err != nil {
		finish(batch, result{retry: err})
		return nil
	}
	fresh := false
	var lastErr error
	err = wait.ExponentialBackoffWithContext(ctx, conflictBackoff, func(ctx context.Context) (bool, error) {
		cm, readFresh, err := w.readKnown(ctx, key, cw, fresh)
		if r, final := settled(err); final {
			w.settle(cw, batch, r)
			rest = nil
			return true, nil
		}
		if err != nil {
			lastErr = fmt.Errorf("get configmap %s: %w", key, err)
			return false, nil
		}
		p := decide(key, cm, w.Trusted, batch)
		rest = p.rest
		if p.oversize {
			// Attribute the refusal to the routes it concerns: each goes
			// out on its own (the others still fit).
			w.alone(ctx, ref, cw, p)
			return true, nil
		}
		if len(p.set) == 0 {
			finishEach(p.res)
			return true, nil
		}
		err = w.patch(ctx, cm, p.set, cw)
		switch {
		case err == nil:
			finishEach(p.res)
			return true, nil
		case apierrors.IsConflict(err) || patchNotApplicable(err):
			// Our content was behind: read the truth and decide again.
			w.Conflicts.Add(1)
			cw.supersede(cm.ResourceVersion)
			fresh, lastErr = true, err
			return false, nil
		case apierrors.IsInvalid(err) && len(p.in) > 1:
			// One of the changes makes the ConfigMap invalid: each goes
			// out on its own, so the refusal reaches its route alone.
			w.alone(ctx, ref, cw, p)
			return true, nil
		case apierrors.IsInvalid(err) && !readFresh:
			// Our content may have been behind (another writer grew the
			// ConfigMap past the size check): decide once more on the
			// truth.
			fresh, lastErr = true, err
			return false, nil
		case apierrors.IsInvalid(err):
			// Refused on the truth: the same write would fail the same
			// way, so it is final.
			req := p.in[0]
			p.res[req] = result{state: Rejected, err: err, blocked: p.res[req].blocked}
			finishEach(p.res)
			return true, nil
		}
		if r, final := settled(err); final {
			w.settle(cw, batch, r)
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
		finish(batch, result{retry: lastErr}) // attempts exhausted on a busy key: back to the workqueue
		return nil
	}
	return rest
}

// alone answers the requests of p that are not in its patch, then writes
// each of those in p.in as a batch of its own.
func (w *Writer) alone(ctx context.Context, ref string, cw *cmWriter, p plan) {
	for _, req := range p.in {
		delete(p.res, req)
	}
	finishEach(p.res)
	for _, req := range p.in {
		w.rounds(ctx, ref, cw, []*request{req})
	}
}

// settle answers every request of batch with r, a state the ConfigMap is
// in for all of them (settled).
func (w *Writer) settle(cw *cmWriter, batch []*request, r result) {
	if r.state == Missing {
		w.forgetLocked(cw)
	}
	finish(batch, r)
}

// patch sends set, decided on cm, as one per-key compare-and-swap patch
// (keyPatch: a key absent from cm is guarded by its resourceVersion) and
// records the write. The response is requested as metadata only: the
// ConfigMap is not sent back and decoded for nothing.
func (w *Writer) patch(ctx context.Context, cm *corev1.ConfigMap, set map[string]*string, cw *cmWriter) error {
	var p client.Patch
	b, ok, err := keyPatch(cm.ResourceVersion, cm.Data, set)
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
