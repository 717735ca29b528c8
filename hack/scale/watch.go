package main

// This file: the watchers that time what the controller writes (ConfigMaps,
// ModelRoutes) and who holds the Lease.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// watchStats is what one watcher received in a phase.
type watchStats struct {
	Events int   `json:"events"`
	Bytes  int64 `json:"bytes"`
	// Modified counts MODIFIED events (resourceVersion changes: the
	// writes) by object: the name of a ConfigMap, namespace/name of a
	// ModelRoute.
	Modified map[string]int `json:"modifiedByObject"`
	// StatusModified counts the MODIFIED events that changed the
	// object's status (ModelRoutes only).
	StatusModified map[string]int `json:"statusModifiedByObject,omitempty"`
}

// objWatcher is one watcher of a collection (every ConfigMap of a
// namespace, as a reload sidecar in API mode is; every ModelRoute): it
// reads the raw JSON stream and counts each event object's bytes and the
// writes per object, per phase.
type objWatcher struct {
	what  string
	phase *phaseVar
	// req is a GET of the collection; the watch parameters are added.
	req func() *rest.Request
	// qualify keys objects by namespace/name instead of name.
	qualify bool
	// status holds each object's last status (nil: not tracked).
	status map[string]string

	mu    sync.Mutex
	stats map[string]*watchStats
	err   error
	rv    string
}

// newCMWatcher watches every ConfigMap of ns from resourceVersion rv.
func newCMWatcher(phase *phaseVar, cs kubernetes.Interface, ns, rv string) *objWatcher {
	return &objWatcher{what: "configmaps", phase: phase, stats: map[string]*watchStats{}, rv: rv,
		req: func() *rest.Request { return cs.CoreV1().RESTClient().Get().Namespace(ns).Resource("configmaps") }}
}

// modelRoutesPath is the ModelRoute collection of every namespace.
const modelRoutesPath = "/apis/" + v1alpha1.Group + "/" + v1alpha1.Version + "/modelroutes"

// newRouteWatcher watches every ModelRoute from resourceVersion rv and
// tells status writes from the others.
func newRouteWatcher(phase *phaseVar, cs kubernetes.Interface, rv string) *objWatcher {
	return &objWatcher{what: "modelroutes", phase: phase, stats: map[string]*watchStats{}, rv: rv, qualify: true, status: map[string]string{},
		req: func() *rest.Request { return cs.CoreV1().RESTClient().Get().AbsPath(modelRoutesPath) }}
}

func (w *objWatcher) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *objWatcher) get(phase string) watchStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.stats[phase]
	if s == nil {
		return watchStats{Modified: map[string]int{}}
	}
	out := *s
	out.Modified = maps.Clone(s.Modified)
	out.StatusModified = maps.Clone(s.StatusModified)
	return out
}

// run watches until ctx ends, reopening the watch from the last seen
// resourceVersion when the server closes it.
func (w *objWatcher) run(ctx context.Context) {
	for ctx.Err() == nil {
		err := w.once(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			return
		}
	}
}

func (w *objWatcher) once(ctx context.Context) error {
	timeout := int64(3600)
	w.mu.Lock()
	rv := w.rv
	w.mu.Unlock()
	stream, err := w.req().
		VersionedParams(&metav1.ListOptions{Watch: true, ResourceVersion: rv, AllowWatchBookmarks: true, TimeoutSeconds: &timeout}, scheme.ParameterCodec).
		Stream(ctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", w.what, err)
	}
	defer stream.Close()
	dec := json.NewDecoder(bufio.NewReaderSize(stream, 1<<20))
	for {
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil // closed by the server: reopen
			}
			return fmt.Errorf("%s watch stream: %w", w.what, err)
		}
		var obj struct {
			Metadata struct {
				Namespace       string `json:"namespace"`
				Name            string `json:"name"`
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
			Message string          `json:"message"`
			Status  json.RawMessage `json:"status"`
		}
		if err := json.Unmarshal(ev.Object, &obj); err != nil {
			return fmt.Errorf("%s watch event: %w", w.what, err)
		}
		if ev.Type == "ERROR" {
			return fmt.Errorf("%s watch: %s", w.what, obj.Message)
		}
		key := obj.Metadata.Name
		if w.qualify {
			key = obj.Metadata.Namespace + "/" + key
		}
		w.mu.Lock()
		w.rv = obj.Metadata.ResourceVersion
		if ev.Type != "BOOKMARK" {
			ph := w.phase.get()
			s := w.stats[ph]
			if s == nil {
				s = &watchStats{Modified: map[string]int{}}
				w.stats[ph] = s
			}
			s.Events++
			s.Bytes += int64(len(ev.Object))
			if ev.Type == "MODIFIED" {
				s.Modified[key]++
			}
			if w.status != nil {
				st := string(obj.Status)
				if ev.Type == "MODIFIED" && st != w.status[key] {
					if s.StatusModified == nil {
						s.StatusModified = map[string]int{}
					}
					s.StatusModified[key]++
				}
				w.status[key] = st
			}
		}
		w.mu.Unlock()
	}
}

// leaseWatcher follows the holder of the controller's leader-election
// Lease and when each holder was first seen.
type leaseWatcher struct {
	mu      sync.Mutex
	holder  string
	changed chan struct{} // closed and replaced on every holder change
	seen    map[string]time.Time
	err     error
}

func newLeaseWatcher() *leaseWatcher {
	return &leaseWatcher{changed: make(chan struct{}), seen: map[string]time.Time{}}
}

func (lw *leaseWatcher) run(ctx context.Context, cs kubernetes.Interface, ns, name string) {
	sel := "metadata.name=" + name
	rv := ""
	for ctx.Err() == nil {
		wi, err := cs.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: rv})
		if err != nil {
			if ctx.Err() == nil {
				lw.mu.Lock()
				lw.err = fmt.Errorf("watch lease %s/%s: %w", ns, name, err)
				lw.mu.Unlock()
			}
			return
		}
		for ev := range wi.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok {
				// An error event (e.g. 410 Gone): watch again from now;
				// its first event is the Lease's current state.
				rv = ""
				break
			}
			at := time.Now()
			rv = l.ResourceVersion
			h := ""
			if l.Spec.HolderIdentity != nil {
				h = *l.Spec.HolderIdentity
			}
			lw.mu.Lock()
			if h != lw.holder {
				lw.holder = h
				if _, ok := lw.seen[h]; !ok {
					lw.seen[h] = at
				}
				close(lw.changed)
				lw.changed = make(chan struct{})
			}
			lw.mu.Unlock()
		}
		wi.Stop()
	}
}

// waitHolder waits until the Lease has a holder other than "" and not,
// and returns it and when it was first seen.
func (lw *leaseWatcher) waitHolder(ctx context.Context, not string, timeout time.Duration, alive func() error) (string, time.Time, error) {
	deadline := time.After(timeout)
	for {
		lw.mu.Lock()
		h, ch, at, err := lw.holder, lw.changed, lw.seen[lw.holder], lw.err
		lw.mu.Unlock()
		if err != nil {
			return "", time.Time{}, err
		}
		if h != "" && h != not {
			return h, at, nil
		}
		if err := alive(); err != nil {
			return "", time.Time{}, err
		}
		select {
		case <-ctx.Done():
			return "", time.Time{}, ctx.Err()
		case <-deadline:
			return "", time.Time{}, fmt.Errorf("no new leader within %s (holder %q)", timeout, h)
		case <-ch:
		case <-time.After(time.Second):
		}
	}
}
