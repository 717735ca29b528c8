package informer

// This file: the ConfigMap change queue. A ConfigMap event asks the
// writer which keys changed (it may read the ConfigMap); the events of one
// ConfigMap are deduplicated in a workqueue and handled by a fixed number
// of workers, so a burst of events costs one pass per ConfigMap instead of
// a goroutine per event.

import (
	"context"
	"sync"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// configMapWorkers handle ConfigMap changes in parallel.
const configMapWorkers = 2

// ConfigMapChanges queues changed ConfigMaps (ns/name) with the latest
// resourceVersion seen; handle runs once per queued ConfigMap.
type ConfigMapChanges struct {
	queue  workqueue.TypedInterface[string]
	handle func(ctx context.Context, ref, rv string, q workqueue.TypedRateLimitingInterface[reconcile.Request])

	mu     sync.Mutex
	latest map[string]string // ref → resourceVersion of its newest event
	out    workqueue.TypedRateLimitingInterface[reconcile.Request]
}

// NewConfigMapChanges returns the queue; handle runs once per queued
// ConfigMap (ns/name) at the resourceVersion of its newest event, with the
// reconcile queue its routes go to.
func NewConfigMapChanges(handle func(context.Context, string, string, workqueue.TypedRateLimitingInterface[reconcile.Request])) *ConfigMapChanges {
	return &ConfigMapChanges{
		queue:  workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Name: "autoconfig-configmap-changes"}),
		handle: handle,
		latest: map[string]string{},
	}
}

// Add queues ref at resourceVersion rv; out is the reconcile queue the
// affected routes go to.
func (c *ConfigMapChanges) Add(ref, rv string, out workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.mu.Lock()
	c.latest[ref] = rv
	c.out = out
	c.mu.Unlock()
	c.queue.Add(ref)
}

// Start runs the workers until ctx ends (manager.Runnable; it runs on the
// leader only, as the controller whose events feed it).
func (c *ConfigMapChanges) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	for range configMapWorkers {
		wg.Go(func() {
			for c.next(ctx) {
			}
		})
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

// next handles one queued ConfigMap; false when the queue is shut down.
func (c *ConfigMapChanges) next(ctx context.Context) bool {
	ref, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(ref)
	c.mu.Lock()
	rv, out := c.latest[ref], c.out
	c.mu.Unlock()
	if out != nil {
		c.handle(ctx, ref, rv, out)
	}
	return true
}
