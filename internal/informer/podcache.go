package informer

// This file: pod caches per (namespace, label selector), only while a
// route selects those pods. Service-discovery routes never read pods, and
// a cluster-wide pod cache was most of the controller's memory (10,000
// pods: about 100 MiB with the initial list's decode), paid even by
// clusters with no selector route at all; a cache of a whole namespace
// still cost every pod of the namespace for a route selecting five of
// them. Each cache lists and watches with its selector, so the API server
// sends only the pods it matches and memory follows the selected pods.
//
// A cache is not a client-go informer but one goroutine (podWatcher.run)
// that keeps a record of each pod (discovery.PodRecord) in a map and hands
// their events to the controller's one pod source (podEvents). With its
// watch's stream decoder and HTTP/2 stream that is 3 goroutines per
// cache; an informer was about 10 (reflector, resync timer, the FIFO's
// pop, the controller's stop wait, the handler's run and pop, the stream
// decoder and HTTP/2 stream, the currency forwarder), a 16 KiB event
// buffer and the DeltaFIFO, indexer and processor besides: with 100
// selectors, 1,000 goroutines and about 11 MB of the controller's peak.
// The caches share a connection of their own without compression
// (podCachesClient). A cache keeps the rules of the informers' currency
// (currency.go) itself: a watch that ends is resumed at once from the last
// version seen; one that cannot be makes the cache stale until a relist
// has replaced its pods and the handlers have seen the difference.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/modelsphere/autoconfig/internal/discovery"
)

// DefaultPodCacheIdle is how long a pod cache is kept after the last route
// selecting its pods went away: a route deleted and re-created (a rename,
// a helm upgrade) does not relist its pods.
const DefaultPodCacheIdle = time.Minute

// podCacheSyncTimeout bounds a cache's first list: a reconcile that waits
// longer for it fails, and the next one starts the cache again.
const podCacheSyncTimeout = 2 * time.Minute

// podWatchTimeout is the shortest time the API server keeps a pod cache's
// watch open (the reflector's): each watch asks for a random time between
// it and twice it, so that the caches do not all resume at once.
const podWatchTimeout = 5 * time.Minute

// PodKey names one pod cache: the pods of namespace ns that selector sel
// matches, sel in its canonical form (labels.Selector's String: sorted
// requirements, so "b=2,a=1" and "a=1, b=2" share one cache). An empty sel
// is every pod of the namespace (the pods behind a Service without a
// selector).
type PodKey struct{ Namespace, Selector string }

func (k PodKey) String() string { return k.Namespace + "/" + k.Selector }

// NewPodKey parses selector for the cache of its pods in ns.
func NewPodKey(ns, selector string) (PodKey, labels.Selector, error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return PodKey{}, nil, fmt.Errorf("selector %q: %w", selector, err)
	}
	return PodKey{Namespace: ns, Selector: sel.String()}, sel, nil
}

// PodCaches runs one pod cache per distinct (namespace, selector) that
// routes read, shared by every route reading it. It is a manager.Runnable
// (the sweep of unused caches); Events is the source of the caches' pod
// events.
type PodCaches struct {
	cfg *rest.Config
	// httpClient, if set, is shared by the caches (podCachesClient),
	// instead of a transport per cache.
	httpClient *http.Client
	// inUse lists the caches routes currently read.
	inUse func(ctx context.Context) ([]PodKey, error)
	// events takes the caches' pod events to the controller (nil: they
	// go nowhere, in tests without a controller).
	events *podEvents
	idle   time.Duration
	// currency is told while a cache is stale (nil: nobody is).
	currency *CacheCurrency

	mu    sync.Mutex
	byKey map[PodKey]*selPods
	pods  corev1client.PodsGetter // from cfg and httpClient, on first use
	// closed: Start has ended (the manager stops); a cache whose first
	// list comes in later stops at once.
	closed bool
}

// PodCacheOptions configure NewPodCaches.
type PodCacheOptions struct {
	// InUse lists the caches routes currently read; the others stop Idle
	// after the last route reading them went away (0 =
	// DefaultPodCacheIdle).
	InUse func(ctx context.Context) ([]PodKey, error)
	Idle  time.Duration
	// Currency is told while a cache is stale (nil: nobody is).
	Currency *CacheCurrency
	// Selected gets the pod events of every cache that change what
	// discovery reads (podChanged), Every all of them, once the
	// controller has started Events (nil: none). The objects are the
	// caches' stored pods, as an informer gives its handlers: they must
	// not be changed.
	Selected, Every handler.EventHandler
}

// NewPodCaches returns the pod caches of cfg's API server: on a
// connection of their own (podCachesClient).
func NewPodCaches(cfg *rest.Config, o PodCacheOptions) (*PodCaches, error) {
	hc, err := podCachesClient(cfg)
	if err != nil {
		return nil, err
	}
	idle := o.Idle
	if idle <= 0 {
		idle = DefaultPodCacheIdle
	}
	p := &PodCaches{cfg: cfg, httpClient: hc, inUse: o.InUse, idle: idle, currency: o.Currency}
	h := podHandlers{selected: o.Selected, every: o.Every, changed: podChanged()}
	if h.selected == nil {
		h.selected = handler.Funcs{}
	}
	if h.every == nil {
		h.every = handler.Funcs{}
	}
	p.events = &podEvents{caches: p, h: h}
	return p, nil
}

// Events is the one source of every cache's pod events (source.Source),
// started with the controller.
func (p *PodCaches) Events() source.Source { return p.events }

type selPods struct {
	ready  chan struct{} // closed once synced (or failed: err set)
	err    error
	cache  *podWatcher
	stop   context.CancelFunc
	unused time.Time // since when no route reads these pods
}

// Reader returns the synced cache of the pods of ns matching selector,
// starting it on first use.
func (p *PodCaches) Reader(ctx context.Context, ns, selector string) (client.Reader, error) {
	k, sel, err := NewPodKey(ns, selector)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	e, ok := p.byKey[k]
	if !ok {
		e = &selPods{ready: make(chan struct{})}
		if p.byKey == nil {
			p.byKey = map[PodKey]*selPods{}
		}
		p.byKey[k] = e
		go p.start(k, sel, e)
	}
	e.unused = time.Time{}
	p.mu.Unlock()
	select {
	case <-e.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if e.err != nil {
		p.mu.Lock()
		if p.byKey[k] == e {
			delete(p.byKey, k) // the next reconcile tries again
		}
		p.mu.Unlock()
		return nil, e.err
	}
	return e.cache, nil
}

// start lists the pods of k.Namespace that sel matches and, once they are in,
// runs the cache's watcher (podWatcher.run) in its own goroutine; this one
// ends with the list.
func (p *PodCaches) start(k PodKey, sel labels.Selector, e *selPods) {
	defer close(e.ready)
	pods, err := p.podsClient()
	if err != nil {
		e.err = fmt.Errorf("pod cache %s: %w", k, err)
		return
	}
	w := &podWatcher{key: k, selector: sel.String(), api: pods.Pods(k.Namespace), currency: p.currency, events: p.events}
	lctx, lcancel := context.WithTimeout(context.Background(), podCacheSyncTimeout)
	// The first list as the reflector's: from the API server's watch
	// cache (resourceVersion 0), not a read of etcd per selector at a
	// cold start.
	rv, _, _, err := w.replace(lctx, "0")
	lcancel()
	if err != nil {
		e.err = fmt.Errorf("pod cache %s did not sync: %w", k, err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		cancel()
		e.err = fmt.Errorf("pod cache %s: stopped", k)
		return
	}
	e.cache, e.stop = w, cancel
	p.mu.Unlock()
	go w.run(ctx, rv)
	ctrl.Log.WithName(logName).V(levelDebug).Info("pod cache started", "namespace", k.Namespace, "selector", k.Selector)
}

// podsClient is the pods API client of the caches, made once.
func (p *PodCaches) podsClient() (corev1client.PodsGetter, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pods != nil {
		return p.pods, nil
	}
	hc := p.httpClient
	if hc == nil {
		var err error
		if hc, err = podCachesClient(p.cfg); err != nil {
			return nil, err
		}
	}
	c, err := corev1client.NewForConfigAndClient(p.cfg, hc)
	if err != nil {
		return nil, err
	}
	p.pods = c
	return c, nil
}

// podWatcher is one pod cache: the pods of namespace key.ns that selector
// matches, stripped, by name. It is the cache's client.Reader too.
type podWatcher struct {
	key      PodKey
	selector string
	api      corev1client.PodInterface
	currency *CacheCurrency
	events   *podEvents

	mu sync.RWMutex
	// pods are the records of the pods (discovery.PodRecord: what
	// StripPod keeps, a quarter of a stripped corev1.Pod's memory), by
	// name; a record never changes once stored: it is replaced.
	pods map[string]*discovery.PodRecord
}

func (w *podWatcher) cacheType() string { return "Pod " + w.key.String() }

// run watches the pods from version rv (that of the list start read) until
// ctx ends, resuming each watch that ends from the last version seen; a
// watch that cannot be resumed makes the cache stale until relist has
// brought it current.
func (w *podWatcher) run(ctx context.Context, rv string) {
	defer w.currency.forget(w) // stopped: it cannot stay stale
	// The listed pods, as an informer's handler added after its sync
	// gets them.
	for _, rec := range w.snapshot() {
		w.events.create(rec.Pod())
	}
	stale := false
	for ctx.Err() == nil {
		if stale {
			next, err := w.relist(ctx)
			if err != nil {
				return // ctx ended
			}
			rv, stale = next, false
		}
		timeout := int64(podWatchTimeout.Seconds() * (1 + rand.Float64()))
		wi, err := w.api.Watch(ctx, metav1.ListOptions{LabelSelector: w.selector, ResourceVersion: rv,
			AllowWatchBookmarks: true, TimeoutSeconds: &timeout})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.currency.markStale(w, err)
			stale = true
			continue
		}
		began := time.Now()
		last, ended := w.apply(ctx, wi)
		wi.Stop()
		ended = watchEnd(ctx, began, last, ended)
		if last != "" {
			rv = last
		}
		if ended != nil {
			// An error event (a version too old to resume, a server
			// error): start over from a list.
			w.currency.markStale(w, ended)
			stale = true
		}
		// A stream that just ended (its timeout, or a cut) is resumed
		// from rv at once; if that fails, the cache is stale.
	}
}

// apply stores the events of wi and hands them to the handlers until wi
// ends, ctx ends, or an error event arrives (returned). last is the
// version of the last event (a bookmark's too).
func (w *podWatcher) apply(ctx context.Context, wi watch.Interface) (last string, ended error) {
	for {
		select {
		case <-ctx.Done():
			return last, nil
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return last, nil
			}
			if ev.Type == watch.Error {
				return last, apierrors.FromObject(ev.Object)
			}
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if pod.ResourceVersion != "" {
				last = pod.ResourceVersion
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				now := discovery.CompactPod(pod)
				w.mu.Lock()
				old := w.pods[now.Name()]
				w.pods[now.Name()] = now
				w.mu.Unlock()
				if old != nil {
					w.events.update(old.Pod(), now.Pod())
				} else {
					w.events.create(now.Pod())
				}
			case watch.Deleted:
				gone := discovery.CompactPod(pod)
				w.mu.Lock()
				delete(w.pods, gone.Name())
				w.mu.Unlock()
				w.events.delete(gone.Pod())
			}
		}
	}
}

// relist lists the pods (a consistent read) until the API server answers
// or ctx ends, replaces the cache's pods with them, hands the handlers the
// difference, and only then marks the cache current. It returns the list's
// version to watch from.
func (w *podWatcher) relist(ctx context.Context) (string, error) {
	rv, before, after, err := w.replace(ctx, "")
	if err != nil {
		return "", err
	}
	// Deletions first, then additions and changes (a changed
	// resourceVersion), as currentLW hands them to an informer.
	changes := 0
	for name, old := range before {
		if _, ok := after[name]; !ok {
			w.events.delete(old.Pod())
			changes++
		}
	}
	for name, now := range after {
		if old, ok := before[name]; !ok {
			w.events.create(now.Pod())
			changes++
		} else if old != now {
			w.events.update(old.Pod(), now.Pod())
			changes++
		}
	}
	w.currency.markCurrent(w, changes)
	return rv, nil
}

// replace lists the pods at version rv, retrying every currencyRetryMin
// to currencyRetryMax until the API server answers or ctx ends (then with
// the last error), and replaces the cache's pods with them (before and
// after, by name): a pod whose resourceVersion did not change stays the
// object stored before. Only the cache's goroutine changes its pods.
func (w *podWatcher) replace(ctx context.Context, rv string) (listed string, before, after map[string]*discovery.PodRecord, err error) {
	l, err := listUntilAnswered(ctx, w.cacheType(), func(ctx context.Context) (*corev1.PodList, error) {
		return w.api.List(ctx, metav1.ListOptions{LabelSelector: w.selector, ResourceVersion: rv})
	})
	if err != nil {
		return "", nil, nil, err
	}
	w.mu.RLock()
	before = w.pods
	w.mu.RUnlock()
	after = make(map[string]*discovery.PodRecord, len(l.Items))
	for i := range l.Items {
		pod := &l.Items[i]
		if old, ok := before[pod.Name]; ok && old.ResourceVersion() == pod.ResourceVersion {
			after[pod.Name] = old
			continue
		}
		after[pod.Name] = discovery.CompactPod(pod)
	}
	w.mu.Lock()
	w.pods = after
	w.mu.Unlock()
	return l.ResourceVersion, before, after, nil
}

// snapshot is the cache's pods (the stored records).
func (w *podWatcher) snapshot() []*discovery.PodRecord {
	w.mu.RLock()
	defer w.mu.RUnlock()
	out := make([]*discovery.PodRecord, 0, len(w.pods))
	for _, pod := range w.pods {
		out = append(out, pod)
	}
	return out
}

// Get reads a pod of the cache (client.Reader, as the controller's cache).
func (w *podWatcher) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	out, ok := obj.(*corev1.Pod)
	if !ok {
		return fmt.Errorf("pod cache: cannot read a %T", obj)
	}
	var rec *discovery.PodRecord
	if key.Namespace == w.key.Namespace {
		w.mu.RLock()
		rec = w.pods[key.Name]
		w.mu.RUnlock()
	}
	if rec == nil {
		return apierrors.NewNotFound(corev1.Resource("pods"), key.Name)
	}
	rec.Pod().DeepCopyInto(out)
	return nil
}

// List lists the cache's pods (client.Reader): those of a label selector
// among them, copies unless UnsafeDisableDeepCopy.
func (w *podWatcher) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	out, ok := list.(*corev1.PodList)
	if !ok {
		return fmt.Errorf("pod cache: cannot list into a %T", list)
	}
	var o client.ListOptions
	o.ApplyOptions(opts)
	if o.FieldSelector != nil && !o.FieldSelector.Empty() {
		return fmt.Errorf("pod cache: field selectors are not supported (%s)", o.FieldSelector)
	}
	out.Items = nil
	if o.Namespace != "" && o.Namespace != w.key.Namespace {
		return nil
	}
	unsafe := o.UnsafeDisableDeepCopy != nil && *o.UnsafeDisableDeepCopy
	for _, rec := range w.snapshot() {
		if o.LabelSelector != nil && !o.LabelSelector.Matches(labels.Set(rec.Labels())) {
			continue
		}
		if unsafe {
			out.Items = append(out.Items, *rec.Pod())
		} else {
			out.Items = append(out.Items, *rec.Pod().DeepCopy())
		}
	}
	return nil
}

// synced are the entries with a synced cache.
func (p *PodCaches) synced() map[PodKey]*selPods {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[PodKey]*selPods{}
	for k, e := range p.byKey {
		select {
		case <-e.ready:
			if e.err == nil && e.cache != nil {
				out[k] = e
			}
		default:
		}
	}
	return out
}

// Running lists the synced pod caches, sorted.
func (p *PodCaches) Running() []PodKey {
	var out []PodKey
	for k := range p.synced() {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b PodKey) int {
		return strings.Compare(a.Namespace+"\x00"+a.Selector, b.Namespace+"\x00"+b.Selector)
	})
	return out
}

// Synced are the synced pod caches (for lookups across them).
func (p *PodCaches) Synced() map[PodKey]client.Reader {
	out := map[PodKey]client.Reader{}
	for k, e := range p.synced() {
		out[k] = e.cache
	}
	return out
}

// sweep stops the caches no route reads any more for idle.
func (p *PodCaches) sweep(ctx context.Context, now time.Time) {
	used, err := p.inUse(ctx)
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, e := range p.byKey {
		if slices.Contains(used, k) {
			e.unused = time.Time{}
			continue
		}
		if e.unused.IsZero() {
			e.unused = now
			continue
		}
		select {
		case <-e.ready:
		default:
			continue // still starting
		}
		if now.Sub(e.unused) >= p.idle {
			if e.stop != nil {
				e.stop()
			}
			delete(p.byKey, k)
			ctrl.Log.WithName(logName).V(levelDebug).Info("pod cache stopped: no route selects these pods", "namespace", k.Namespace, "selector", k.Selector)
		}
	}
}

// Start implements manager.Runnable: the sweep loop.
func (p *PodCaches) Start(ctx context.Context) error {
	t := time.NewTicker(max(p.idle/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			p.mu.Lock()
			p.closed = true
			for _, e := range p.byKey {
				if e.stop != nil {
					e.stop()
				}
			}
			p.mu.Unlock()
			return nil
		case now := <-t.C:
			p.sweep(ctx, now)
		}
	}
}

// podCachesClient is the HTTP client of every pod cache: their own
// connection, so that their watches (one per distinct selector) do not
// take the HTTP/2 streams of the manager's connection, which then dials
// more; and without compression, which costs each open watch a gzip
// reader (about 70 KB: 7 MB of heap for 100 selectors) for a few pods'
// events.
func podCachesClient(cfg *rest.Config) (*http.Client, error) {
	c := rest.CopyConfig(cfg)
	c.DisableCompression = true
	return rest.HTTPClientFor(c)
}
