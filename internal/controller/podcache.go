package controller

// This file: pod caches per namespace, only while a route selects pods
// there. Service-discovery routes never read pods, and a cluster-wide pod
// cache was most of the controller's memory (10,000 pods: about 100 MiB
// with the initial list's decode), paid even by clusters with no selector
// route at all.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// DefaultPodCacheIdle is how long a namespace's pod cache is kept after
// the last route selecting pods there went away: a route deleted and
// re-created (a rename, a helm upgrade) does not relist the namespace.
const DefaultPodCacheIdle = time.Minute

// podCaches runs one pod cache per namespace where a route selects pods.
type podCaches struct {
	cfg    *rest.Config
	scheme *runtime.Scheme
	// inUse lists the namespaces that currently have selector routes.
	inUse func(ctx context.Context) ([]string, error)
	// watch connects a started cache's pod events to the controller.
	watch func(c cache.Cache) error
	idle  time.Duration

	mu   sync.Mutex
	byNS map[string]*nsPods
}

type nsPods struct {
	ready  chan struct{} // closed once synced (or failed: err set)
	err    error
	cache  cache.Cache
	stop   context.CancelFunc
	unused time.Time // since when no selector route is in the namespace
}

// reader returns the synced pod cache of ns, starting it on first use.
func (p *podCaches) reader(ctx context.Context, ns string) (client.Reader, error) {
	p.mu.Lock()
	e, ok := p.byNS[ns]
	if !ok {
		e = &nsPods{ready: make(chan struct{})}
		if p.byNS == nil {
			p.byNS = map[string]*nsPods{}
		}
		p.byNS[ns] = e
		go p.start(ns, e)
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
		if p.byNS[ns] == e {
			delete(p.byNS, ns) // the next reconcile tries again
		}
		p.mu.Unlock()
		return nil, e.err
	}
	return e.cache, nil
}

func (p *podCaches) start(ns string, e *nsPods) {
	defer close(e.ready)
	c, err := cache.New(p.cfg, cache.Options{
		Scheme:            p.scheme,
		DefaultNamespaces: map[string]cache.Config{ns: {}},
		DefaultTransform:  cache.TransformStripManagedFields(),
		ByObject:          map[client.Object]cache.ByObject{&corev1.Pod{}: {Transform: discovery.StripPod}},
	})
	if err != nil {
		e.err = fmt.Errorf("pod cache for namespace %s: %w", ns, err)
		return
	}
	if err := c.IndexField(context.Background(), &corev1.Pod{}, discovery.IndexPodNode, discovery.PodNodeIndex); err != nil {
		e.err = fmt.Errorf("pod cache for namespace %s: %w", ns, err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		if err := c.Start(ctx); err != nil {
			ctrl.Log.WithName(Name).Error(err, "pod cache stopped", "namespace", ns)
		}
	}()
	sctx, scancel := context.WithTimeout(ctx, 2*time.Minute)
	defer scancel()
	if _, err := c.GetInformer(sctx, &corev1.Pod{}); err != nil || !c.WaitForCacheSync(sctx) {
		cancel()
		e.err = fmt.Errorf("pod cache for namespace %s did not sync: %v", ns, err)
		return
	}
	if err := p.watch(c); err != nil {
		cancel()
		e.err = fmt.Errorf("watch pods in namespace %s: %w", ns, err)
		return
	}
	p.mu.Lock()
	e.cache, e.stop = c, cancel
	p.mu.Unlock()
	ctrl.Log.WithName(Name).V(levelDebug).Info("pod cache started", "namespace", ns)
}

// running lists the namespaces with a synced pod cache, sorted.
func (p *podCaches) running() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for ns, e := range p.byNS {
		select {
		case <-e.ready:
			if e.err == nil {
				out = append(out, ns)
			}
		default:
		}
	}
	slices.Sort(out)
	return out
}

// readers are the synced pod caches (for lookups across namespaces).
func (p *podCaches) readers() []client.Reader {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []client.Reader
	for _, e := range p.byNS {
		select {
		case <-e.ready:
			if e.err == nil {
				out = append(out, e.cache)
			}
		default:
		}
	}
	return out
}

// sweep stops the caches of namespaces without selector routes for idle.
func (p *podCaches) sweep(ctx context.Context, now time.Time) {
	used, err := p.inUse(ctx)
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for ns, e := range p.byNS {
		if slices.Contains(used, ns) {
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
			delete(p.byNS, ns)
			ctrl.Log.WithName(Name).V(levelDebug).Info("pod cache stopped: no route selects pods here", "namespace", ns)
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
			for _, e := range p.byNS {
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

// podWatch connects a pod cache's events to the controller through
// mapPod, with podChanged dropping updates discovery does not read.
func (r *Reconciler) podWatch(c controller.Controller) func(cache.Cache) error {
	return func(pc cache.Cache) error {
		if err := c.Watch(source.Kind[client.Object](pc, &corev1.Pod{},
			handler.EnqueueRequestsFromMapFunc(r.mapPod), podChanged())); err != nil {
			return err
		}
		return c.Watch(source.Kind[client.Object](pc, &corev1.Pod{}, r.consumerPodHandler()))
	}
}

// podNamespaces lists the namespaces whose pods routes read: those of the
// routes that select pods, and those of the consumer Services
// (spec.nginx.service, spec.cart.service) whose pods report what they
// serve.
func (r *Reconciler) podNamespaces(ctx context.Context) ([]string, error) {
	var l v1alpha1.ModelRouteList
	if err := r.Client.List(ctx, &l, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	var out []string
	add := func(ns string) {
		if !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	for i := range l.Items {
		rt := &l.Items[i]
		if len(discovery.RouteSelectors(rt)) > 0 {
			add(rt.Namespace)
		}
		for _, g := range consumerGroups(rt) {
			if ns, _, _ := strings.Cut(g.service, "/"); g.service != "" && r.watches(ns) {
				add(ns)
			}
		}
	}
	return out, nil
}

// podReader is the pod cache of ns (started on first use).
func (r *Reconciler) podReader(ctx context.Context, ns string) (client.Reader, error) {
	if r.pods == nil {
		return r.Client, nil // tests without a manager
	}
	return r.pods.reader(ctx, ns)
}
