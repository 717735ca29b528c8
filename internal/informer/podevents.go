package informer

// This file: the pod caches' events: the one source the controller
// starts, and which pod updates reach its handlers.

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/modelsphere/autoconfig/internal/discovery"
)

// podEvents is the controller's one source of pod events: every pod cache
// hands its events to it, and it passes them to the handler with the
// controller's queue (a source.Informer per cache was a handler with its
// own goroutines and buffer per cache). The objects are the caches'
// stored pods, as an informer gives its handlers: they must not be
// changed.
type podEvents struct {
	h handler.EventHandler
	// caches are replayed to the handlers when the controller starts.
	caches *PodCaches

	mu  sync.RWMutex
	q   workqueue.TypedRateLimitingInterface[reconcile.Request]
	ctx context.Context // the controller's
}

// Start implements source.Source: the controller starts it when this
// replica leads. Until then there is no queue and the events go nowhere:
// the initial sync reconciles every route when the replica starts leading.
func (s *podEvents) Start(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	s.mu.Lock()
	s.q, s.ctx = q, ctx
	s.mu.Unlock()
	if s.caches != nil {
		// The pods of the caches started before, as an informer gives
		// a handler added late; in the background, as an informer's
		// handler gets them: the handlers read the manager's cache,
		// which may not have synced yet.
		go func() {
			for _, e := range s.caches.synced() {
				for _, rec := range e.cache.snapshot() {
					s.create(rec.Pod())
				}
			}
		}()
	}
	return nil
}

func (s *podEvents) String() string { return "pod caches" }

// target is the controller's context and queue, nil before Start.
func (s *podEvents) target() (context.Context, workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if s == nil {
		return nil, nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.ctx, s.q
}

func (s *podEvents) create(pod *corev1.Pod) {
	if ctx, q := s.target(); q != nil {
		s.h.Create(ctx, event.CreateEvent{Object: pod}, q)
	}
}

func (s *podEvents) update(old, now *corev1.Pod) {
	if ctx, q := s.target(); q != nil {
		s.h.Update(ctx, event.UpdateEvent{ObjectOld: old, ObjectNew: now}, q)
	}
}

func (s *podEvents) delete(pod *corev1.Pod) {
	if ctx, q := s.target(); q != nil {
		s.h.Delete(ctx, event.DeleteEvent{Object: pod}, q)
	}
}

// podHandlers is the handler of the pod updates discovery reads (podChanged)
// and the handler of every pod event, as one handler.
type podHandlers struct {
	selected, every handler.EventHandler
	changed         predicate.Predicate
}

func (h podHandlers) Create(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if h.changed.Create(e) {
		h.selected.Create(ctx, e, q)
	}
	h.every.Create(ctx, e, q)
}

func (h podHandlers) Update(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if h.changed.Update(e) {
		h.selected.Update(ctx, e, q)
	}
	h.every.Update(ctx, e, q)
}

func (h podHandlers) Delete(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if h.changed.Delete(e) {
		h.selected.Delete(ctx, e, q)
	}
	h.every.Delete(ctx, e, q)
}

func (h podHandlers) Generic(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if h.changed.Generic(e) {
		h.selected.Generic(ctx, e, q)
	}
	h.every.Generic(ctx, e, q)
}

// podChanged drops pod updates that change nothing discovery reads (the
// pod caches keep records, so only the resourceVersion differs then): the
// two pods' records are compared, not their stripped pods rebuilt.
func podChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		pa, okA := e.ObjectOld.(*corev1.Pod)
		pb, okB := e.ObjectNew.(*corev1.Pod)
		if !okA || !okB {
			return true
		}
		return !discovery.CompactPod(pa).SameExceptVersion(discovery.CompactPod(pb))
	}}
}
