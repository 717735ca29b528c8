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
//
// Every write goes one way: a route's change of a ConfigMap is a request
// to that ConfigMap's one writer, which gathers the requests of a window
// (none with Window 0) into a batch and writes it in rounds (batch.go).
// The decision of a round (decide.go) is shared with DryRun, which reads
// the ConfigMap, decides the same way and writes nothing.
package sink

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
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

// maxAttempts bounds the retries of one ConfigMap write. In one process
// the ConfigMap's writer is its only writer, so a retry means our cached
// read was stale or someone else (the CART chart, kubectl, a second
// controller process) changed it. A new key is guarded by the ConfigMap's
// resourceVersion, so writers in several processes adding keys to one
// ConfigMap at once conflict with each other: 12 attempts (2.3-4.6 s of
// jittered backoff) let 20 such writers through on a loaded 2-core
// machine under the race detector, where 7 (0.6-1.3 s) did not always. A
// persistent failure goes back to the workqueue.
const maxAttempts = 12

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
// absent has no value to test: its addition tests the ConfigMap's
// resourceVersion instead, always (so no route adds a key over another's
// unseen addition, and a stale read cannot add a key someone else has
// just added). Routes of one process adding their own keys to one
// ConfigMap at once do not conflict: they go out in one batch.
type Guard func(cm *corev1.ConfigMap, key string) error

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
	// Err explains RenderFailed, TooLarge, Forbidden and Rejected.
	Err error
	// Blocked are the keys the Guard kept the route from writing or
	// removing (the others were handled).
	Blocked []KeyError
	// Sums are, for Written and Unchanged, the SHA-256 of what each key
	// that was not blocked now holds: a ConfigMap event showing exactly
	// that is the route's own write, not a change to react to.
	Sums map[string]Sum
	// Changes are, for Written, the keys the write set or deleted, with
	// the content before and after, sorted by key.
	Changes []KeyChange
}

// KeyChange is one key a write sets or deletes.
type KeyChange struct {
	Key string
	// Live is the content the write was decided on; nil: the key was
	// absent.
	Live *string
	// Want is the content written; nil: the key is deleted.
	Want *string
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

// Writer writes outputs. Client reads metadata (normally the manager's
// cache) and patches; APIReader reads the content fresh. Safe for
// concurrent use.
type Writer struct {
	Client    client.Client
	APIReader client.Reader
	// Trusted are route namespaces that may write any ConfigMap (Granted).
	Trusted []string
	// Window is how long the writer of a ConfigMap gathers the changes of
	// the routes sharing it before they go out as one patch
	// (DefaultBatchWindow). Zero sends a batch as soon as the writer is
	// free: a change on its own, or those that arrived meanwhile.
	Window time.Duration
	// Batches counts the batches written (every write is in one).
	Batches atomic.Int64
	// Conflicts counts the patches refused because the ConfigMap had
	// changed since it was read (a failed test or a 409): each is
	// retried on a fresh read.
	Conflicts atomic.Int64

	mu  sync.Mutex
	cms map[string]*cmWriter
	// hold, while open, keeps batches from being written (Hold).
	hold chan struct{}
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

// KeyWriter is what a route's reconcile asks of the sink: the Writer, or
// DryRun to learn what the Writer would do.
type KeyWriter interface {
	ApplyRecorded(ctx context.Context, routeNS string, outputs []compiler.Output, guard Guard, record func(cm string, sums map[string]Sum)) ([]Outcome, error)
	Remove(ctx context.Context, routeNS string, keys map[string][]string, guard Guard) ([]Outcome, error)
	Check(ctx context.Context, routeNS string, keys map[string][]string, guard Guard) ([]Outcome, error)
}

var (
	_ KeyWriter = (*Writer)(nil)
	_ KeyWriter = DryRun{}
)

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
	return w.write(ctx, applyRequests(routeNS, outputs, guard, record))
}

// Remove deletes keys (ConfigMap "ns/name" → keys) written by a route in
// routeNS, each only if guard (nil = allow all) allows it on the current
// content. A missing ConfigMap is fine (nothing to remove); a ConfigMap
// the route may not write is left alone (it cannot hold the route's keys).
func (w *Writer) Remove(ctx context.Context, routeNS string, keys map[string][]string, guard Guard) ([]Outcome, error) {
	return w.write(ctx, removeRequests(routeNS, keys, guard))
}

// write submits every request to its ConfigMap's writer at once and
// waits for their batches.
func (w *Writer) write(ctx context.Context, reqs []*request) ([]Outcome, error) {
	results := make([]result, len(reqs))
	if len(reqs) == 1 {
		results[0] = w.submit(ctx, reqs[0])
	} else {
		var wg sync.WaitGroup
		for i, req := range reqs {
			wg.Go(func() { results[i] = w.submit(ctx, req) })
		}
		wg.Wait()
	}
	return outcomes(reqs, results)
}

// Check reports, without writing, what Apply or Remove would find in each
// ConfigMap of keys (ConfigMap "ns/name" → keys): Missing, NotPermitted,
// or Unchanged with the keys guard (nil = allow all) blocks. It decides on
// the content the Writer knows (read as for a write: the metadata through
// Client, normally the cache), for routes that have nothing to write yet
// but should say everything in their way at once.
func (w *Writer) Check(ctx context.Context, routeNS string, keys map[string][]string, guard Guard) ([]Outcome, error) {
	reqs := checkRequests(routeNS, keys, guard)
	results := make([]result, len(reqs))
	for i, req := range reqs {
		results[i] = w.check(ctx, req)
	}
	return outcomes(reqs, results)
}

// check decides req on the content the Writer knows, writing nothing.
func (w *Writer) check(ctx context.Context, req *request) result {
	key, err := objectKey(req.ref)
	if err != nil {
		return result{retry: err}
	}
	cw := w.cmWriter(req.ref)
	cw.write.Lock()
	defer cw.write.Unlock()
	cm, err := w.read(ctx, key, cw, false)
	r := decideRead(key, cm, err, w.Trusted, req)
	if r.state == Missing {
		w.forgetLocked(cw)
	}
	return r
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

// conflictBackoff spaces the attempts of a round on a busy key: 5-10ms
// before the first retry, then growing by 1.6 (jittered) to 0.9-1.8 s
// before the last. wait.Backoff ends the attempts once the duration
// reaches Cap, so Cap is above the last step: every one of the
// maxAttempts is made (with factor 2 and a 500 ms cap only 7 were).
var conflictBackoff = wait.Backoff{Steps: maxAttempts, Duration: 5 * time.Millisecond, Factor: 1.6, Jitter: 1, Cap: 2 * time.Second}
