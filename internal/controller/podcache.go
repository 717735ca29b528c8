package controller

// This file: pod caches per (namespace, label selector), only while a
// route selects those pods. Service-discovery routes never read pods, and
// a cluster-wide pod cache was most of the controller's memory (10,000
// pods: about 100 MiB with the initial list's decode), paid even by
// clusters with no selector route at all; a cache of a whole namespace
// still cost every pod of the namespace for a route selecting five of
// them. Each cache lists and watches with its selector, so the API server
// sends only the pods it matches and memory follows the selected pods. A
// cache is a plain client-go informer (7 goroutines, about 40 KiB before
// its pods), on a connection the caches share without compression.

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// DefaultPodCacheIdle is how long a pod cache is kept after the last route
// selecting its pods went away: a route deleted and re-created (a rename,
// a helm upgrade) does not relist its pods.
const DefaultPodCacheIdle = time.Minute

// podKey names one pod cache: the pods of namespace ns that selector sel
// matches, sel in its canonical form (labels.Selector's String: sorted
// requirements, so "b=2,a=1" and "a=1, b=2" share one cache). An empty sel
// is every pod of the namespace (the pods behind a Service without a
// selector).
type podKey struct{ ns, sel string }

func (k podKey) String() string { return k.ns + "/" + k.sel }

// newPodKey parses selector for the cache of its pods in ns.
func newPodKey(ns, selector string) (podKey, labels.Selector, error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return podKey{}, nil, fmt.Errorf("selector %q: %w", selector, err)
	}
	return podKey{ns: ns, sel: sel.String()}, sel, nil
}

// podCaches runs one pod cache per distinct (namespace, selector) that
// routes read, shared by every route reading it.
type podCaches struct {
	cfg *rest.Config
	// httpClient, if set, is shared by the caches (podCachesClient),
	// instead of a transport per cache.
	httpClient *http.Client
	// inUse lists the caches routes currently read.
	inUse func(ctx context.Context) ([]podKey, error)
	// watch connects a started cache's pod events to the controller.
	watch func(inf cache.Informer) error
	idle  time.Duration
	// currency builds the caches' informers (nil: client-go's own).
	currency *CacheCurrency

	mu    sync.Mutex
	byKey map[podKey]*selPods
	pods  corev1client.PodsGetter // from cfg and httpClient, on first use
}

type selPods struct {
	ready  chan struct{} // closed once synced (or failed: err set)
	err    error
	cache  *podStore
	stop   context.CancelFunc
	unused time.Time // since when no route reads these pods
}

// reader returns the synced cache of the pods of ns matching selector,
// starting it on first use.
func (p *podCaches) reader(ctx context.Context, ns, selector string) (client.Reader, error) {
	k, sel, err := newPodKey(ns, selector)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	e, ok := p.byKey[k]
	if !ok {
		e = &selPods{ready: make(chan struct{})}
		if p.byKey == nil {
			p.byKey = map[podKey]*selPods{}
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

// start runs the informer of the pods of k.ns that sel matches: a plain
// client-go informer (a controller-runtime cache per selector cost about
// 15 goroutines and 80 KiB before its first pod; with 100 selectors that
// was most of what selector routes added to the controller), its pods
// stripped (discovery.StripPod).
func (p *podCaches) start(k podKey, sel labels.Selector, e *selPods) {
	defer close(e.ready)
	pods, err := p.podsClient()
	if err != nil {
		e.err = fmt.Errorf("pod cache %s: %w", k, err)
		return
	}
	api := pods.Pods(k.ns)
	selector := sel.String()
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return api.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return api.Watch(ctx, o)
		},
	}
	newInformer := toolscache.NewSharedIndexInformer
	if f := p.currency.newInformer(); f != nil {
		newInformer = f
	}
	inf := newInformer(lw, &corev1.Pod{}, 0, toolscache.Indexers{})
	if err := inf.SetTransform(discovery.StripPod); err != nil {
		e.err = fmt.Errorf("pod cache %s: %w", k, err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	go inf.RunWithContext(ctx)
	sctx, scancel := context.WithTimeout(ctx, 2*time.Minute)
	defer scancel()
	if !toolscache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
		cancel()
		e.err = fmt.Errorf("pod cache %s did not sync", k)
		return
	}
	if err := p.watch(inf); err != nil {
		cancel()
		e.err = fmt.Errorf("watch pods %s: %w", k, err)
		return
	}
	p.mu.Lock()
	e.cache, e.stop = &podStore{ns: k.ns, store: inf.GetStore()}, cancel
	p.mu.Unlock()
	ctrl.Log.WithName(Name).V(levelDebug).Info("pod cache started", "namespace", k.ns, "selector", k.sel)
}

// podsClient is the pods API client of the caches, made once.
func (p *podCaches) podsClient() (corev1client.PodsGetter, error) {
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

// podStore reads one pod cache's store: the pods of namespace ns that its
// selector matched (client.Reader, as the controller's cache).
type podStore struct {
	ns    string
	store toolscache.Store
}

func (s *podStore) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	out, ok := obj.(*corev1.Pod)
	if !ok {
		return fmt.Errorf("pod cache: cannot read a %T", obj)
	}
	item, exists, err := s.store.GetByKey(key.Namespace + "/" + key.Name)
	if err != nil {
		return err
	}
	if !exists {
		return apierrors.NewNotFound(corev1.Resource("pods"), key.Name)
	}
	item.(*corev1.Pod).DeepCopyInto(out)
	return nil
}

func (s *podStore) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
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
	if o.Namespace != "" && o.Namespace != s.ns {
		return nil
	}
	unsafe := o.UnsafeDisableDeepCopy != nil && *o.UnsafeDisableDeepCopy
	for _, item := range s.store.List() {
		pod := item.(*corev1.Pod)
		if o.LabelSelector != nil && !o.LabelSelector.Matches(labels.Set(pod.Labels)) {
			continue
		}
		if unsafe {
			out.Items = append(out.Items, *pod)
		} else {
			out.Items = append(out.Items, *pod.DeepCopy())
		}
	}
	return nil
}

// synced are the entries with a synced cache.
func (p *podCaches) synced() map[podKey]*selPods {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[podKey]*selPods{}
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

// running lists the synced pod caches, sorted.
func (p *podCaches) running() []podKey {
	var out []podKey
	for k := range p.synced() {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b podKey) int { return strings.Compare(a.ns+"\x00"+a.sel, b.ns+"\x00"+b.sel) })
	return out
}

// readers are the synced pod caches (for lookups across them).
func (p *podCaches) readers() []client.Reader {
	var out []client.Reader
	for _, e := range p.synced() {
		out = append(out, e.cache)
	}
	return out
}

// sweep stops the caches no route reads any more for idle.
func (p *podCaches) sweep(ctx context.Context, now time.Time) {
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
			ctrl.Log.WithName(Name).V(levelDebug).Info("pod cache stopped: no route selects these pods", "namespace", k.ns, "selector", k.sel)
		}
	}
}

// Start implements manager.Runnable: the sweep loop.
func (p *podCaches) Start(ctx context.Context) error {
	t := time.NewTicker(max(p.idle/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			p.mu.Lock()
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

// podWatch connects a pod cache's events to the controller: through
// mapPod, with podChanged dropping updates discovery does not read, and
// through the consumer pods' handler. One handler per cache: each handler
// of an informer keeps its own event buffer.
func (r *Reconciler) podWatch(c controller.Controller) func(cache.Informer) error {
	return func(inf cache.Informer) error {
		return c.Watch(&source.Informer{Informer: inf, Handler: podHandlers{
			selected: handler.EnqueueRequestsFromMapFunc(r.mapPod), changed: podChanged(),
			consumers: r.consumerPodHandler(),
		}})
	}
}

// podHandlers is mapPod's handler behind podChanged, and the consumer
// pods' handler (which filters on its own), as one handler.
type podHandlers struct {
	selected, consumers handler.EventHandler
	changed             predicate.Predicate
}

func (h podHandlers) Create(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if h.changed.Create(e) {
		h.selected.Create(ctx, e, q)
	}
	h.consumers.Create(ctx, e, q)
}

func (h podHandlers) Update(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if h.changed.Update(e) {
		h.selected.Update(ctx, e, q)
	}
	h.consumers.Update(ctx, e, q)
}

func (h podHandlers) Delete(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if h.changed.Delete(e) {
		h.selected.Delete(ctx, e, q)
	}
	h.consumers.Delete(ctx, e, q)
}

func (h podHandlers) Generic(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if h.changed.Generic(e) {
		h.selected.Generic(ctx, e, q)
	}
	h.consumers.Generic(ctx, e, q)
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

// podSelectors lists the pod caches routes read: one per distinct selector
// of the routes that select pods (discovery.RouteSelectors, in the route's
// namespace), and one per consumer Service (spec.nginx.service,
// spec.cart.service) whose pods report what they serve: the pods its
// selector matches.
func (r *Reconciler) podSelectors(ctx context.Context) ([]podKey, error) {
	var l v1alpha1.ModelRouteList
	if err := r.Client.List(ctx, &l, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	var out []podKey
	add := func(k podKey) {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	for i := range l.Items {
		rt := &l.Items[i]
		for _, s := range discovery.RouteSelectors(rt) {
			if k, _, err := newPodKey(rt.Namespace, s); err == nil {
				add(k)
			}
		}
		for _, g := range consumerGroups(rt) {
			if g.service == "" {
				continue
			}
			if ns, _, _ := strings.Cut(g.service, "/"); !r.watches(ns) {
				continue
			}
			ns, sel, err := r.servicePods(ctx, g.service)
			if err != nil {
				return nil, err
			}
			if k, _, err := newPodKey(ns, sel); err == nil {
				add(k)
			}
		}
	}
	return out, nil
}

// servicePods tells which pods are behind the Service ref ("ns/name"):
// those of its namespace that its selector matches; every pod of the
// namespace for a Service without a selector (whose endpoints someone else
// maintains) or not in the cache (yet).
func (r *Reconciler) servicePods(ctx context.Context, ref string) (ns, selector string, err error) {
	ns, name, _ := strings.Cut(ref, "/")
	var svc corev1.Service
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &svc); err != nil {
		if apierrors.IsNotFound(err) {
			return ns, "", nil
		}
		return ns, "", fmt.Errorf("get service %s: %w", ref, err)
	}
	return ns, labels.SelectorFromSet(svc.Spec.Selector).String(), nil
}

// podReader is the cache of the pods of ns matching selector (started on
// first use).
func (r *Reconciler) podReader(ctx context.Context, ns, selector string) (client.Reader, error) {
	if r.pods == nil {
		return r.Client, nil // tests without a manager
	}
	return r.pods.reader(ctx, ns, selector)
}
