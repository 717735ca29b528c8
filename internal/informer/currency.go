package informer

// This file: cache currency. A replica whose connection to the API server
// was cut (its informers' watches ended and could not be resumed) must not
// write from what its caches held before the cut, and must be current again
// promptly once the API server answers.
//
// client-go's reflector, left alone, retries a broken watch with an
// exponential backoff (0.8 s doubling to 30 s, jittered up to twice that)
// that grows through the outage, and nothing tells its users when it has
// caught up: a standby that was cut off too and then took the Lease wrote
// nothing for 7 s and was current only 8.9 s after the API server
// returned, and could write from its stale cache meanwhile.
//
// Every informer of the manager is built here with a ListerWatcher
// (currentLW) whose watch never ends for the reflector: when the API
// server's stream ends, the watch is resumed at once from the last event;
// when it cannot be (the API server is away, or the version is too old),
// the informer is stale, and it is retried every 250 ms–1 s until the API
// server answers. Then it lists the collection (a consistent read), hands
// the reflector the difference to the cache as watch events (deletions,
// then additions and changes), waits until the cache holds the last of
// them, and only then is current again and resumes watching from the
// list's version. While any cache is stale, reconciles wait (Wait) and a
// reconcile that began before a cut does not write (Current); when the
// last one is current again, every route is queued (OnCurrent).
//
// The pod caches (podcache.go) are not informers: each is one goroutine
// that lists and watches by itself (podWatcher), and it keeps the same
// rules in its own loop: a watch that ends is resumed at once; one that
// cannot be makes the cache stale until a relist has replaced its pods
// and its handlers have seen the difference. Both report to the same
// CacheCurrency (a currencyMember each).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// How a stale cache retries: the pause between attempts doubles from
// currencyRetryMin to currencyRetryMax, so it is current again at most
// about a second after the API server answers.
const (
	currencyRetryMin = 250 * time.Millisecond
	currencyRetryMax = time.Second
	// currencyApplyTimeout bounds the wait for the cache to hold the
	// difference handed to the reflector (it takes milliseconds).
	currencyApplyTimeout = 30 * time.Second
)

// CacheCurrency tracks whether every informer built by NewInformer, and
// every pod cache, holds what the API server holds. The zero value is not
// usable; a nil one reports current always (tests that build no informers
// through it).
type CacheCurrency struct {
	mu        sync.Mutex
	stale     map[currencyMember]string // stale caches and why
	epoch     uint64                    // counts the cuts: changes when one begins
	since     time.Time                 // when the current cut began
	current   chan struct{}             // closed while no cache is stale
	onCurrent []func()
}

// NewCacheCurrency returns a CacheCurrency with no stale cache.
func NewCacheCurrency() *CacheCurrency {
	c := &CacheCurrency{stale: map[currencyMember]string{}, current: make(chan struct{})}
	close(c.current)
	return c
}

// NewInformer builds a shared informer over lw that resumes its watch by
// itself and reports to c while it is stale: cache.Options.NewInformer.
func (c *CacheCurrency) NewInformer(lw cache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers cache.Indexers) cache.SharedIndexInformer {
	w := &currentLW{inner: cache.ToListerWatcherWithContext(lw), c: c, typ: typeName(obj), obj: obj}
	inf := cache.NewSharedIndexInformer(w, obj, resync, indexers)
	w.store = inf.GetStore()
	return inf
}

// Wait blocks while a cache is stale (or until ctx ends).
func (c *CacheCurrency) Wait(ctx context.Context) error {
	if c == nil {
		return nil
	}
	for {
		c.mu.Lock()
		ch := c.current
		c.mu.Unlock()
		select {
		case <-ch:
			c.mu.Lock()
			ok := len(c.stale) == 0
			c.mu.Unlock()
			if ok {
				return nil
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Epoch identifies the current stretch without a cut; Current(epoch)
// tells whether it still lasts.
func (c *CacheCurrency) Epoch() uint64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch
}

// Current reports whether no cut began since Epoch returned epoch and no
// cache is stale: what was read from the caches since then may be
// written.
func (c *CacheCurrency) Current(epoch uint64) bool {
	if c == nil {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch == epoch && len(c.stale) == 0
}

// OnCurrent registers f, called (in its own goroutine) each time the last
// stale cache is current again.
func (c *CacheCurrency) OnCurrent(f func()) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onCurrent = append(c.onCurrent, f)
}

// currencyMember is a cache that reports to CacheCurrency while it is
// stale: an informer's currentLW, or a pod cache's podWatcher. It is a map
// key, so it must be comparable (a pointer).
type currencyMember interface {
	// cacheType names what the cache holds, for the logs.
	cacheType() string
}

func (c *CacheCurrency) markStale(w currencyMember, why error) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.stale[w]; ok {
		return
	}
	c.stale[w] = why.Error()
	if len(c.stale) == 1 {
		c.epoch++
		c.since = time.Now()
		c.current = make(chan struct{})
		ctrl.Log.WithName(logName).Info("cache not current: a watch ended and cannot be resumed; writes wait until every cache is current again",
			"type", w.cacheType(), "error", why.Error())
	}
}

func (c *CacheCurrency) markCurrent(w currencyMember, changes int) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.stale[w]; !ok {
		return
	}
	delete(c.stale, w)
	ctrl.Log.WithName(logName).V(levelDebug).Info("cache current again", "type", w.cacheType(), "changes", changes)
	if len(c.stale) > 0 {
		return
	}
	close(c.current)
	ctrl.Log.WithName(logName).Info("every cache current again; queueing every route", "staleSeconds", time.Since(c.since).Seconds())
	for _, f := range c.onCurrent {
		go f()
	}
}

// forget drops a stopped cache (an informer, or a pod cache no route
// reads any more), so that it cannot stay stale.
func (c *CacheCurrency) forget(w currencyMember) {
	if c == nil {
		return
	}
	c.mu.Lock()
	_, ok := c.stale[w]
	c.mu.Unlock()
	if ok {
		c.markCurrent(w, 0)
	}
}

func typeName(obj runtime.Object) string {
	if gvk := obj.GetObjectKind().GroupVersionKind(); !gvk.Empty() {
		return gvk.Kind
	}
	return fmt.Sprintf("%T", obj)
}

// currentLW is an informer's ListerWatcher: its watches end only when the
// reflector stops them (see the file comment).
type currentLW struct {
	inner cache.ListerWatcherWithContext
	c     *CacheCurrency
	typ   string
	obj   runtime.Object // the informer's type
	store cache.Store

	mu    sync.Mutex
	stale bool // the last watch ended and was not resumed
}

var _ cache.ListerWatcherWithContext = (*currentLW)(nil)

func (w *currentLW) cacheType() string { return w.typ }

// IsWatchListSemanticsUnSupported: the reflector lists and then watches
// (currentLW resumes plain watches, not watch-list streams).
func (w *currentLW) IsWatchListSemanticsUnSupported() bool { return true }

func (w *currentLW) List(opts metav1.ListOptions) (runtime.Object, error) {
	return w.ListWithContext(context.Background(), opts)
}

func (w *currentLW) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return w.WatchWithContext(context.Background(), opts)
}

// ListWithContext is the reflector's list: retried while the API server
// cannot be reached, instead of growing the reflector's backoff.
func (w *currentLW) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	delay := currencyRetryMin
	for {
		l, err := w.inner.ListWithContext(ctx, opts)
		if err == nil || !unreachable(err) || ctx.Err() != nil {
			return l, err
		}
		if !sleep(ctx, delay) {
			return nil, ctx.Err()
		}
		delay = min(2*delay, currencyRetryMax)
	}
}

// WatchWithContext returns a watch that lasts until the reflector stops it
// or ctx ends, resuming the API server's watches underneath.
func (w *currentLW) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	out := &resumedWatch{ch: make(chan watch.Event), cancel: cancel}
	go func() {
		defer close(out.ch)
		w.run(ctx, opts, out.ch)
		if parent.Err() != nil {
			w.c.forget(w) // the informer stopped
		}
	}()
	return out, nil
}

// run forwards the API server's watch events to out, resuming each watch
// that ends from the last version seen; a watch that cannot be resumed
// makes the informer stale until catchUp has brought the cache current.
func (w *currentLW) run(ctx context.Context, opts metav1.ListOptions, out chan<- watch.Event) {
	rv := opts.ResourceVersion
	w.mu.Lock()
	stale := w.stale
	w.mu.Unlock()
	for ctx.Err() == nil {
		if stale {
			next, err := w.catchUp(ctx, opts, out)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				ctrl.Log.WithName(logName).Error(err, "cache not current: cannot read the list; retrying", "type", w.typ)
				sleep(ctx, currencyRetryMax)
				continue
			}
			rv, stale = next, false
		}
		o := opts
		o.ResourceVersion = rv
		inner, err := w.inner.WatchWithContext(ctx, o)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.setStale(err)
			stale = true
			continue
		}
		began := time.Now()
		last, ended := forward(ctx, inner, out)
		inner.Stop()
		ended = watchEnd(ctx, began, last, ended)
		if last != "" {
			rv = last
		}
		if ended != nil {
			// An error event (a version too old to resume, a server
			// error): start over from a list.
			w.setStale(ended)
			stale = true
		}
		// A stream that just ended (its timeout, or a cut) is resumed
		// from rv at once; if that fails, the informer is stale.
	}
}

// listUntilAnswered calls list until the API server answers, pausing
// currencyRetryMin, doubling to currencyRetryMax, between attempts; a
// refusal (an answer, not an absence: Forbidden, say) is logged, and the
// cache waits until it is fixed. When ctx ends it returns the last error.
func listUntilAnswered[T any](ctx context.Context, typ string, list func(context.Context) (T, error)) (T, error) {
	delay := currencyRetryMin
	for {
		l, err := list(ctx)
		if err == nil {
			return l, nil
		}
		if ctx.Err() != nil {
			return l, err
		}
		if !unreachable(err) {
			ctrl.Log.WithName(logName).Error(err, "cache not current: the list is refused; retrying", "type", typ)
		}
		if !sleep(ctx, delay) {
			return l, err
		}
		delay = min(2*delay, currencyRetryMax)
	}
}

// watchEnd is why a watch that ended (began at began, its last event's
// version last, its error event ended) cannot simply be resumed: its error
// event, or, for a watch that ended at once without an event, that it did
// not reach the API server (client-go returns an empty watch, not an
// error, for a connection reset or a timeout). nil: resume it from last.
func watchEnd(ctx context.Context, began time.Time, last string, ended error) error {
	if last == "" && ended == nil && time.Since(began) < time.Second && ctx.Err() == nil {
		return errors.New("the watch ended at once: the API server is not reachable")
	}
	return ended
}

func (w *currentLW) setStale(why error) {
	w.mu.Lock()
	w.stale = true
	w.mu.Unlock()
	w.c.markStale(w, why)
}

// forward passes inner's events to out until inner ends, ctx ends, or an
// error event arrives (returned). last is the version of the last event.
func forward(ctx context.Context, inner watch.Interface, out chan<- watch.Event) (last string, ended error) {
	for {
		select {
		case <-ctx.Done():
			return last, nil
		case ev, ok := <-inner.ResultChan():
			if !ok {
				return last, nil
			}
			if ev.Type == watch.Error {
				return last, apierrors.FromObject(ev.Object)
			}
			if a, err := meta.Accessor(ev.Object); err == nil && a.GetResourceVersion() != "" {
				last = a.GetResourceVersion()
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return last, nil
			}
		}
	}
}

// catchUp lists the collection until the API server answers, hands the
// difference to the cache to out as events, waits until the cache holds
// the last of them, and marks the informer current. It returns the list's
// version to watch from.
func (w *currentLW) catchUp(ctx context.Context, opts metav1.ListOptions, out chan<- watch.Event) (string, error) {
	lo := metav1.ListOptions{LabelSelector: opts.LabelSelector, FieldSelector: opts.FieldSelector} // a consistent read
	list, err := listUntilAnswered(ctx, w.typ, func(ctx context.Context) (runtime.Object, error) {
		return w.inner.ListWithContext(ctx, lo)
	})
	if err != nil {
		return "", err
	}
	lm, err := meta.ListAccessor(list)
	if err != nil {
		return "", err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return "", err
	}
	events := w.difference(items)
	for _, ev := range events {
		select {
		case out <- ev:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	if len(events) > 0 {
		w.waitApplied(ctx, events[len(events)-1])
	}
	// The reflector resumes from the list's version if it restarts the
	// watch itself.
	if bm := w.obj.DeepCopyObject(); bm != nil {
		if a, err := meta.Accessor(bm); err == nil {
			a.SetResourceVersion(lm.GetResourceVersion())
			select {
			case out <- watch.Event{Type: watch.Bookmark, Object: bm}:
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
	}
	w.mu.Lock()
	w.stale = false
	w.mu.Unlock()
	w.c.markCurrent(w, len(events))
	return lm.GetResourceVersion(), nil
}

// difference is what turns the cache into items: deletions of what is
// gone, then additions and changes (a changed resourceVersion).
func (w *currentLW) difference(items []runtime.Object) []watch.Event {
	have := map[string]string{}
	for _, o := range w.store.List() {
		if k, err := cache.MetaNamespaceKeyFunc(o); err == nil {
			if a, err := meta.Accessor(o); err == nil {
				have[k] = a.GetResourceVersion()
			}
		}
	}
	var dels, sets []watch.Event
	seen := map[string]bool{}
	for _, o := range items {
		k, err := cache.MetaNamespaceKeyFunc(o)
		if err != nil {
			continue
		}
		seen[k] = true
		a, err := meta.Accessor(o)
		if err != nil {
			continue
		}
		rv, ok := have[k]
		switch {
		case !ok:
			sets = append(sets, watch.Event{Type: watch.Added, Object: o})
		case rv != a.GetResourceVersion():
			sets = append(sets, watch.Event{Type: watch.Modified, Object: o})
		}
	}
	for _, o := range w.store.List() {
		k, err := cache.MetaNamespaceKeyFunc(o)
		if err != nil || seen[k] {
			continue
		}
		if ro, ok := o.(runtime.Object); ok {
			dels = append(dels, watch.Event{Type: watch.Deleted, Object: ro})
		}
	}
	return append(dels, sets...)
}

// waitApplied waits until the cache shows ev (the informer applies events
// in order, so every earlier one too).
func (w *currentLW) waitApplied(ctx context.Context, ev watch.Event) {
	k, err := cache.MetaNamespaceKeyFunc(ev.Object)
	if err != nil {
		return
	}
	a, err := meta.Accessor(ev.Object)
	if err != nil {
		return
	}
	want := a.GetResourceVersion()
	deadline := time.Now().Add(currencyApplyTimeout)
	for {
		o, exists, _ := w.store.GetByKey(k)
		if ev.Type == watch.Deleted && !exists {
			return
		}
		if ev.Type != watch.Deleted && exists {
			if oa, err := meta.Accessor(o); err == nil && oa.GetResourceVersion() == want {
				return
			}
		}
		if time.Now().After(deadline) {
			ctrl.Log.WithName(logName).Error(errors.New("timed out"), "cache did not apply the caught-up state; treating it as current", "type", w.typ, "key", k)
			return
		}
		if !sleep(ctx, 5*time.Millisecond) {
			return
		}
	}
}

// unreachable: the request did not reach the API server or got no
// answer (a refused, reset or timed-out connection), or the API server is
// not ready to answer it (restarting, overloaded); not an answer such as
// Forbidden or NotFound, which the reflector handles.
func unreachable(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true
	}
	return apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) ||
		apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// resumedWatch is the watch the reflector gets from currentLW.
type resumedWatch struct {
	ch     chan watch.Event
	cancel context.CancelFunc
}

func (r *resumedWatch) ResultChan() <-chan watch.Event { return r.ch }

func (r *resumedWatch) Stop() { r.cancel() }

// Resync queues every route when the caches are current again after a
// cut (CacheCurrency.OnCurrent(QueueAll)). The controller starts it when
// this replica leads; until then (a standby) there is nothing to queue:
// its initial sync reconciles every route when it starts leading.
type Resync struct {
	// Client lists the routes (the manager's cache).
	Client client.Reader

	mu sync.Mutex
	q  workqueue.TypedRateLimitingInterface[reconcile.Request]
	// ctx is the controller's
	ctx context.Context
}

// Start implements source.Source.
func (s *Resync) Start(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.q, s.ctx = q, ctx
	return nil
}

// QueueAll adds every route of the cache to the queue: not rate-limited,
// so a route whose reconcile failed during the cut does not wait out its
// backoff.
func (s *Resync) QueueAll() {
	s.mu.Lock()
	q, ctx := s.q, s.ctx
	s.mu.Unlock()
	if q == nil || ctx.Err() != nil {
		return
	}
	var l v1alpha1.ModelRouteList
	if err := s.Client.List(ctx, &l, client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "list routes to reconcile after the caches were current again")
		return
	}
	for i := range l.Items {
		q.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&l.Items[i])})
	}
}

// newInformer is cache.Options.NewInformer: c's, or nil (client-go's) for
// a nil c.
func (c *CacheCurrency) newInformer() func(cache.ListerWatcher, runtime.Object, time.Duration, cache.Indexers) cache.SharedIndexInformer {
	if c == nil {
		return nil
	}
	return c.NewInformer
}

// CacheOptions are o with c building the informers.
func (c *CacheCurrency) CacheOptions(o ctrlcache.Options) ctrlcache.Options {
	o.NewInformer = c.newInformer()
	return o
}
