package controller

// This file: the spec cache. CUE validates a route's spec once per
// generation, never per endpoint change.

import (
	"errors"
	"runtime"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// specCache holds the validated spec per route UID and generation: CUE is
// evaluated once per spec generation, never per endpoint change. It keeps
// a route's name, namespace and validated spec, nothing of its metadata or
// status.
type specCache struct {
	mu sync.Mutex
	m  map[types.UID]specEntry
	// slots bound the validations run at once to the CPUs: CUE's
	// evaluation is CPU-bound, so more at once only adds to the heap (at
	// start-up, every route is validated by --max-concurrent-reconciles
	// reconciles in parallel, each evaluation allocating ~300 KB).
	slots chan struct{}
}

type specEntry struct {
	name       types.NamespacedName
	generation int64
	spec       *v1alpha1.ModelRoute
	err        error
}

func (c *specCache) validate(v Validator, route *v1alpha1.ModelRoute) (*v1alpha1.ModelRoute, error) {
	c.mu.Lock()
	e, ok := c.m[route.UID]
	if c.slots == nil {
		c.slots = make(chan struct{}, runtime.GOMAXPROCS(0))
	}
	slots := c.slots
	c.mu.Unlock()
	if ok && e.generation == route.Generation {
		return e.spec, e.err
	}
	slots <- struct{}{}
	spec, err := v.ValidateObject(route)
	<-slots
	specValidations.Inc()
	var inv *schema.InvalidError
	if err != nil && !errors.As(err, &inv) {
		return nil, err // not cached: may be transient
	}
	if spec != nil {
		// The validated route's readers (discovery, the compile, the
		// fallback Service) read its name, namespace and spec only.
		// ValidateObject's copy of the metadata and the status it shares
		// with this reconcile's copy of the route would otherwise stay
		// here for the route's life, beside the informer's own.
		spec = &v1alpha1.ModelRoute{TypeMeta: spec.TypeMeta, ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Namespace: spec.Namespace}, Spec: spec.Spec}
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[types.UID]specEntry{}
	}
	c.m[route.UID] = specEntry{name: client.ObjectKeyFromObject(route), generation: route.Generation, spec: spec, err: err}
	c.mu.Unlock()
	return spec, err
}

func (c *specCache) forgetName(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for uid, e := range c.m {
		if e.name == key {
			delete(c.m, uid)
		}
	}
}
