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
//
// Which keys a route may write or remove is the caller's decision (a
// Guard: key ownership), made on the content the patch then tests, so the
// decision and the write cannot be separated by another writer. A write
// that would take the ConfigMap over the API server's size limit is not
// sent (TooLarge, with the sizes).
package sink

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	// TooLarge: the write would take the ConfigMap over MaxSize; nothing
	// was written (Err says by how much and names the largest keys).
	TooLarge State = "TooLarge"
	// Forbidden: the API server refused the write for the controller's
	// identity (RBAC); nothing was written (Err has the API's words).
	Forbidden State = "Forbidden"
	// Rejected: the API server refused the patched ConfigMap as invalid
	// (an invalid key name, a size limit it counts differently); nothing
	// was written and, since the same write would fail the same way, it is
	// not retried (Err has the API's words).
	Rejected State = "Rejected"
)

// MaxSize is the API server's limit on a ConfigMap's data: the sum of the
// lengths of its values (data and binaryData), 1 MiB.
const MaxSize = 1 << 20

// Guard decides, on the ConfigMap's current content, whether the route may
// write (Apply) or remove (Remove) key: a nil error allows it, an error
// blocks that key alone (reported in Outcome.Blocked, nothing written to
// it). The patch that follows tests the value the guard saw. A key that is
// absent has no value to test: exclusive asks that its addition test the
// ConfigMap's resourceVersion instead (other routes claim the key too, so
// none may add it over another's unseen addition). Uncontended additions
// go without it, so routes adding their own keys to one ConfigMap at once
// do not conflict.
type Guard func(cm *corev1.ConfigMap, key string) (exclusive bool, err error)

// KeyError is one key a Guard blocked.
type KeyError struct {
	Key string
	Err error
}

// Outcome is the result for one ConfigMap.
type Outcome struct {
	// ConfigMap is ns/name.
	ConfigMap string
	State     State
	// Keys are the route's keys in this ConfigMap (written or not).
	Keys []string
	// Err explains RenderFailed, TooLarge and Forbidden.
	Err error
	// Blocked are the keys the Guard kept the route from writing or
	// removing (the others were handled).
	Blocked []KeyError
	// Sums are, for Written and Unchanged, the SHA-256 of what each key
	// that was not blocked now holds: a ConfigMap event showing exactly
	// that is the route's own write, not a change to react to.
	Sums map[string]Sum
}

// Sum is the SHA-256 of a key's value.
type Sum [sha256.Size]byte

// SumOf is the Sum of a value.
func SumOf(v string) Sum { return sha256.Sum256([]byte(v)) }

func (o Outcome) String() string {
	s := fmt.Sprintf("%s %s", o.ConfigMap, o.State)
	if o.Err != nil {
		s += ": " + o.Err.Error()
	}
	for _, b := range o.Blocked {
		s += fmt.Sprintf("; %s blocked: %v", b.Key, b.Err)
	}
	return s
}

// Writer writes outputs. Client reads (normally the manager's cache) and
// patches; APIReader reads fresh after a conflict. Safe for concurrent use.
type Writer struct {
	Client    client.Client
	APIReader client.Reader
	// Trusted are route namespaces that may write any ConfigMap (Granted).
	Trusted []string
	// Window, when set, makes the Writer the one writer of each
	// ConfigMap: the changes of the routes sharing it that arrive within
	// Window go out as one patch (DefaultBatchWindow). Zero writes each
	// route's change on its own.
	Window time.Duration
	// Batches counts the batched flushes (tests, metrics).
	Batches atomic.Int64
	// Conflicts counts the patches refused because the ConfigMap had
	// changed since it was read (a failed test or a 409): each is
	// retried on a fresh read.
	Conflicts atomic.Int64

	mu  sync.Mutex
	cms map[string]*cmWriter
}

// Granted says whether a route in routeNS may use obj (read a Service,
// write a ConfigMap): always in its own namespace; elsewhere when obj's
// AllowedNamespacesAnnotation lists routeNS (or "*"), or when routeNS is
// one of the namespaces the controller trusts (--trusted-namespace, for
// the platform team's central route namespace).
func Granted(obj metav1.Object, routeNS string, trusted []string) bool {
	if obj.GetNamespace() == routeNS || slices.Contains(trusted, routeNS) {
		return true
	}
	for _, ns := range strings.Split(obj.GetAnnotations()[AllowedNamespacesAnnotation], ",") {
		ns = strings.TrimSpace(ns)
		if ns == "*" || (ns != "" && ns == routeNS) {
			return true
		}
	}
	return false
}

// Apply writes outputs (grouped by ConfigMap, in first-seen order) for a
// route in routeNS; guard (nil = allow all) decides per key. The error is
// for API failures worth a retry; per ConfigMap states are in the outcomes.
func (w *Writer) Apply(ctx context.Context, routeNS string, outputs []compiler.Output, guard Guard) ([]Outcome, error) {
	return w.ApplyRecorded(ctx, routeNS, outputs, guard, nil)
}

// ApplyRecorded is Apply, calling record (when not nil) with the Sums of
// each ConfigMap's keys as decided, before the patch is sent: the watch
// event of the write can arrive before Apply returns.
func (w *Writer) ApplyRecorded(ctx context.Context, routeNS string, outputs []compiler.Output, guard Guard, record func(cm string, sums map[string]Sum)) ([]Outcome, error) {
	var order []string
	byCM := map[string][]compiler.Output{}
	for _, o := range outputs {
		if _, ok := byCM[o.ConfigMap]; !ok {
			order = append(order, o.ConfigMap)
		}
		byCM[o.ConfigMap] = append(byCM[o.ConfigMap], o)
	}
	keys := map[string][]string{}
	changes := map[string]changeFunc{}
	// One slot per ConfigMap, written only by that ConfigMap's change
	// (batched changes of several ConfigMaps run concurrently).
	sums := map[string]*map[string]Sum{}
	for _, cm := range order {
		outs := byCM[cm]
		for _, o := range outs {
			keys[cm] = append(keys[cm], o.Key)
		}
		slot := new(map[string]Sum)
		sums[cm] = slot
		changes[cm] = func(c *corev1.ConfigMap) (change, error) {
			ch := change{set: map[string]*string{}}
			sum := map[string]Sum{}
			*slot = sum // the last decision is the one written
			for _, o := range outs {
				if guard != nil {
					excl, err := guard(c, o.Key)
					if err != nil {
						ch.blocked = append(ch.blocked, KeyError{o.Key, err})
						continue
					}
					if excl {
						ch.exclusive = append(ch.exclusive, o.Key)
					}
				}
				cur, ok := c.Data[o.Key]
				var in []byte
				if ok {
					in = []byte(cur)
				}
				b, err := o.Render(in)
				if err != nil {
					return ch, fmt.Errorf("render %s: %w", o.Key, err)
				}
				sum[o.Key] = sha256.Sum256(b)
				if !ok || !bytes.Equal(b, in) {
					s := string(b)
					ch.set[o.Key] = &s
				}
			}
			if record != nil {
				record(cm, sum)
			}
			return ch, nil
		}
	}
	var res []Outcome
	var errs []error
	if w.Window > 0 {
		res, errs = w.applyBatched(ctx, order, keys, changes, routeNS)
	} else {
		for _, cm := range order {
			st, rerr, blocked, err := w.update(ctx, cm, routeNS, changes[cm])
			if err != nil {
				errs = append(errs, err)
				continue
			}
			res = append(res, Outcome{ConfigMap: cm, State: st, Keys: keys[cm], Err: rerr, Blocked: blocked})
		}
	}
	for i, o := range res {
		if o.State == Written || o.State == Unchanged {
			res[i].Sums = *sums[o.ConfigMap]
		}
	}
	return res, errors.Join(errs...)
}

// Remove deletes keys (ConfigMap "ns/name" → keys) written by a route in
// routeNS, each only if guard (nil = allow all) allows it on the current
// content. A missing ConfigMap is fine (nothing to remove); a ConfigMap
// the route may not write is left alone (it cannot hold the route's keys).
func (w *Writer) Remove(ctx context.Context, routeNS string, keys map[string][]string, guard Guard) ([]Outcome, error) {
	var res []Outcome
	var errs []error
	for _, cm := range slices.Sorted(maps.Keys(keys)) {
		ks := keys[cm]
		st, _, blocked, err := w.update(ctx, cm, routeNS, func(c *corev1.ConfigMap) (change, error) {
			ch := change{set: map[string]*string{}}
			for _, k := range ks {
				if _, ok := c.Data[k]; !ok {
					continue
				}
				if guard != nil {
					if _, err := guard(c, k); err != nil {
						ch.blocked = append(ch.blocked, KeyError{k, err})
						continue
					}
				}
				ch.set[k] = nil
			}
			return ch, nil
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		res = append(res, Outcome{ConfigMap: cm, State: st, Keys: ks, Blocked: blocked})
	}
	return res, errors.Join(errs...)
}

// update reads cm, asks change for the keys to set (non-nil) or delete
// (nil), and patches exactly those keys with a per-key compare-and-swap
// (keyPatch). When the patch finds a key changed underneath (a failed JSON
// patch test is 422 Invalid, a stale resourceVersion 409 Conflict), our read
// was behind: it re-reads from the API server and re-renders, up to
// maxAttempts times with conflictBackoff. The second result is a render or
// size error (RenderFailed, TooLarge), the third the keys change blocked.
func (w *Writer) update(ctx context.Context, ref, routeNS string, change changeFunc) (State, error, []KeyError, error) {
	cw := w.cmWriter(ref)
	cw.write.Lock()
	defer cw.write.Unlock()
	return w.updateLocked(ctx, ref, cw, routeNS, change)
}

// updateLocked is update with cw.write held.
func (w *Writer) updateLocked(ctx context.Context, ref string, cw *cmWriter, routeNS string, change changeFunc) (State, error, []KeyError, error) {
	key, err := objectKey(ref)
	if err != nil {
		return "", nil, nil, err
	}
	var (
		fresh     bool
		state     State
		renderErr error
		blocked   []KeyError
		patchErr  error
	)
	err = wait.ExponentialBackoffWithContext(ctx, conflictBackoff, func(ctx context.Context) (bool, error) {
		state, renderErr, blocked, patchErr = w.tryUpdate(ctx, key, cw, fresh, routeNS, change)
		switch {
		case patchErr == nil:
			return true, nil
		case apierrors.IsConflict(patchErr) || patchNotApplicable(patchErr):
			w.Conflicts.Add(1)
			fresh = true // read the truth and redo
			return false, nil
		case apierrors.IsInvalid(patchErr):
			// The patched object is invalid. Our read may have been
			// behind (another writer grew the ConfigMap past the size
			// check): read the truth once; a second refusal is final.
			if !fresh {
				fresh = true
				return false, nil
			}
			state, renderErr, patchErr = Rejected, patchErr, nil
			return true, nil
		}
		return true, patchErr
	})
	if wait.Interrupted(err) && patchErr != nil {
		err = patchErr // attempts exhausted on a busy key: back to the workqueue
	}
	if err != nil {
		return "", nil, nil, err
	}
	return state, renderErr, blocked, nil
}

// patchNotApplicable reports whether the API server could not apply our
// JSON patch to the current object (a test op failed, a removed key was
// gone): our read was behind, and a fresh read and render fix it. The API
// server answers it with 422 Invalid like a validation error, but without
// the object's kind or any cause, while a validation error of the patched
// ConfigMap (Too long, an invalid key) names ConfigMap and the field —
// retrying that would send the same refused write again.
func patchNotApplicable(err error) bool {
	var s apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &s) {
		return false
	}
	d := s.Status().Details
	return d == nil || (d.Kind == "" && len(d.Causes) == 0)
}

// change is what a changeFunc decided for one ConfigMap.
type change struct {
	// set: the keys to set (non-nil) or delete (nil).
	set map[string]*string
	// blocked: the keys the guard blocked.
	blocked []KeyError
	// exclusive: keys that, when absent, must be added exclusively.
	exclusive []string
}

// changeFunc decides, for a ConfigMap's current content, what to change.
type changeFunc func(*corev1.ConfigMap) (change, error)

// conflictBackoff spaces the attempts of update on a busy key: 5-10ms
// before the first retry, then doubling (jittered, at most 500ms).
var conflictBackoff = wait.Backoff{Steps: maxAttempts, Duration: 5 * time.Millisecond, Factor: 2, Jitter: 1, Cap: 500 * time.Millisecond}

// tryUpdate is one attempt of update: read key (fresh: from the API
// server), render, patch. The error is a read error (wrapped) or the
// patch's own error.
func (w *Writer) tryUpdate(ctx context.Context, key client.ObjectKey, cw *cmWriter, fresh bool, routeNS string, decide changeFunc) (State, error, []KeyError, error) {
	cm, fresh, err := w.readKnown(ctx, key, cw, fresh)
	if err != nil {
		if r, final := settled(err); final {
			if r.state == Missing {
				w.forgetLocked(cw)
			}
			return r.state, r.renderErr, nil, nil
		}
		return "", nil, nil, fmt.Errorf("get configmap %s: %w", key, err)
	}
	if !Granted(cm, routeNS, w.Trusted) {
		return NotPermitted, nil, nil, nil
	}
	ch, err := decide(cm)
	changed, blocked := ch.set, ch.blocked
	if err != nil {
		return RenderFailed, err, blocked, nil
	}
	if len(changed) == 0 {
		return Unchanged, nil, blocked, nil
	}
	if !fresh && addsAbsentKey(cm.Data, changed) {
		// A key absent from what we know is added without a test of its
		// value (JSON patch cannot test absence), so a stale read would
		// mean a redundant write, or one over a key another route has
		// just claimed: read the truth first. This costs one GET, only
		// when a key first appears. (The batched path guards such keys
		// with the resourceVersion instead: it is the ConfigMap's only
		// writer in this process.)
		return w.tryUpdate(ctx, key, cw, true, routeNS, decide)
	}
	if size, grows := sizeAfter(cm, changed); grows && size > MaxSize {
		return TooLarge, tooLarge(key, cm, changed, size), blocked, nil
	}
	switch err := w.patch(ctx, cm, changed, ch.exclusive, cw); {
	case err == nil:
		return Written, nil, blocked, nil
	case apierrors.IsNotFound(err):
		w.forgetLocked(cw)
		return Missing, nil, blocked, nil
	case apierrors.IsForbidden(err):
		return Forbidden, err, blocked, nil
	case apierrors.IsConflict(err) || apierrors.IsInvalid(err):
		cw.supersede(cm.ResourceVersion)
		return "", nil, blocked, err
	default:
		return "", nil, blocked, fmt.Errorf("patch configmap %s: %w", key, err)
	}
}

// sizeAfter is the ConfigMap's size (as the API server counts it: the
// values of data and binaryData) after changed, and whether changed makes
// it larger (a removal or a shrinking write is always let through).
func sizeAfter(cm *corev1.ConfigMap, changed map[string]*string) (int, bool) {
	size := 0
	for _, v := range cm.Data {
		size += len(v)
	}
	for _, v := range cm.BinaryData {
		size += len(v)
	}
	before := size
	for k, v := range changed {
		size -= len(cm.Data[k])
		if v != nil {
			size += len(*v)
		}
	}
	return size, size > before
}

// tooLarge explains a write refused by size, in the user's terms.
func tooLarge(key client.ObjectKey, cm *corev1.ConfigMap, changed map[string]*string, size int) error {
	type kv struct {
		k string
		n int
	}
	var all []kv
	for k, v := range cm.Data {
		if _, ok := changed[k]; !ok {
			all = append(all, kv{k, len(v)})
		}
	}
	for k, v := range cm.BinaryData {
		all = append(all, kv{k, len(v)})
	}
	var mine []string
	for k, v := range changed {
		if v != nil {
			all = append(all, kv{k, len(*v)})
			mine = append(mine, fmt.Sprintf("%s (%s)", k, humanSize(len(*v))))
		}
	}
	slices.Sort(mine)
	slices.SortFunc(all, func(a, b kv) int {
		if a.n != b.n {
			return b.n - a.n
		}
		return strings.Compare(a.k, b.k)
	})
	var top []string
	for _, e := range all[:min(3, len(all))] {
		top = append(top, fmt.Sprintf("%s (%s)", e.k, humanSize(e.n)))
	}
	return fmt.Errorf("ConfigMap %s would be %s with %s, over the %s limit of the API server; the largest keys are %s: remove keys or move routes to another ConfigMap",
		key, humanSize(size), strings.Join(mine, ", "), humanSize(MaxSize), strings.Join(top, ", "))
}

// humanSize is n bytes as B, KiB or MiB (two decimals).
func humanSize(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
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

// Check reports, without writing, what Apply or Remove would find in each
// ConfigMap of keys (ConfigMap "ns/name" → keys): Missing, NotPermitted,
// or Unchanged with the keys guard (nil = allow all) blocks. It reads
// through Client (normally the cache), for routes that have nothing to
// write yet but should say everything in their way at once.
func (w *Writer) Check(ctx context.Context, routeNS string, keys map[string][]string, guard Guard) ([]Outcome, error) {
	var res []Outcome
	var errs []error
	for _, ref := range slices.Sorted(maps.Keys(keys)) {
		o, err := w.check(ctx, ref, routeNS, keys[ref], guard)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		res = append(res, o)
	}
	return res, errors.Join(errs...)
}

func (w *Writer) check(ctx context.Context, ref, routeNS string, keys []string, guard Guard) (Outcome, error) {
	key, err := objectKey(ref)
	if err != nil {
		return Outcome{}, err
	}
	cw := w.cmWriter(ref)
	cw.write.Lock()
	defer cw.write.Unlock()
	o := Outcome{ConfigMap: ref, State: Unchanged, Keys: keys}
	cm, err := w.read(ctx, key, cw, false)
	switch {
	case apierrors.IsNotFound(err):
		w.forgetLocked(cw)
		o.State = Missing
	case apierrors.IsForbidden(err):
		o.State, o.Err = Forbidden, err
	case err != nil:
		return Outcome{}, fmt.Errorf("get configmap %s: %w", ref, err)
	case !Granted(cm, routeNS, w.Trusted):
		o.State = NotPermitted
	case guard != nil:
		for _, k := range o.Keys {
			if _, err := guard(cm, k); err != nil {
				o.Blocked = append(o.Blocked, KeyError{k, err})
			}
		}
	}
	return o, nil
}
