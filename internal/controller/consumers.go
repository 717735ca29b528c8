package controller

// This file: end-to-end truth. Which of the route's consumer pods serve
// its current output, from the served reports their reload sidecars keep
// on their own Pods (package served): status.consumers, status.synced and
// the Applied condition.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TypeApplied: every consumer pod that reports what it serves serves the
// route's current output (True, reason Synced); False (Stale) names the
// pods that do not; Unknown (NotTracked) when no pod reports.
const TypeApplied = "Applied"

// Applied reasons.
const (
	ReasonSynced     = "Synced"
	ReasonStale      = "Stale"
	ReasonNotTracked = "NotTracked"
	// ReasonNotWritten: the route holds none of its nginx keys (blocked,
	// not rendered yet), so there is nothing to compare with.
	ReasonNotWritten = "NotWritten"
)

// consumerPods are the pods ("ns/name") behind the route's
// spec.nginx.service, from its EndpointSlices; ok is false when the route
// names no Service or its namespace is not watched.
func (r *Reconciler) consumerPods(ctx context.Context, route *v1alpha1.ModelRoute) (svc string, pods []string, ok bool, err error) {
	if route.Spec.Nginx.Service == "" {
		return "", nil, false, nil
	}
	svc = compiler.ResolveRef(compilerRoute(route), route.Spec.Nginx.Service)
	ns, name, _ := strings.Cut(svc, "/")
	if !r.watches(ns) {
		return svc, nil, false, nil
	}
	var sl discoveryv1.EndpointSliceList
	if err := r.Client.List(ctx, &sl, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: name}); err != nil {
		return svc, nil, false, fmt.Errorf("list endpointslices of %s: %w", svc, err)
	}
	for i := range sl.Items {
		pods = append(pods, discovery.SlicePods(&sl.Items[i])...)
	}
	slices.Sort(pods)
	return svc, slices.Compact(pods), true, nil
}

// watches reports whether the controller caches namespace ns.
func (r *Reconciler) watches(ns string) bool {
	return len(r.Namespaces) == 0 || slices.Contains(r.Namespaces, ns)
}

// reconcileConsumers sets status.consumers, status.synced and Applied: for
// each pod behind spec.nginx.service and each of the route's keys in its
// nginx output ConfigMap, whether the pod's served report names the
// content the route last wrote there.
func (r *Reconciler) reconcileConsumers(ctx context.Context, st *state) error {
	route := st.route
	key := client.ObjectKeyFromObject(route)
	svc, pods, ok, err := r.consumerPods(ctx, route)
	if err != nil {
		return err
	}
	if !ok {
		route.Status.Consumers, route.Status.Synced = nil, ""
		msg := "spec.nginx.service is not set: the consumer pods are not known (set it to the openresty entry's Service, and run its reload sidecars with --pod-name)"
		if svc != "" {
			msg = fmt.Sprintf("the consumer Service %s is in a namespace the controller does not watch", svc)
		}
		setCondition(route, TypeApplied, metav1.ConditionUnknown, ReasonNotTracked, msg)
		r.applied.forget(key)
		return nil
	}
	cm := compiler.ResolveRef(compilerRoute(route), route.Spec.Nginx.OutputConfigMap)
	current := map[string]string{} // key → ID of what the route last wrote
	for k, sum := range r.owned.sumsIn(key, cm) {
		current[k] = served.IDOfSum(sum)
	}
	keys := slices.Sorted(maps.Keys(current))
	if len(keys) == 0 {
		route.Status.Consumers, route.Status.Synced = nil, ""
		setCondition(route, TypeApplied, metav1.ConditionUnknown, ReasonNotWritten, fmt.Sprintf("the route holds none of its keys in %s yet", cm))
		return nil
	}
	ns, _, _ := strings.Cut(svc, "/")
	pr, err := r.podReader(ctx, ns)
	if err != nil {
		return fmt.Errorf("consumer pods of %s: %w", svc, err)
	}
	r.applied.changed(key, current, st.started)
	var (
		consumers         []v1alpha1.Consumer
		tracked, synced   int
		stale, notTracked []string
		log               = ctrl.LoggerFrom(ctx)
		counts            = map[string]int{}
	)
	for _, p := range pods {
		pns, pname, _ := strings.Cut(p, "/")
		var pod corev1.Pod
		if err := pr.Get(ctx, types.NamespacedName{Namespace: pns, Name: pname}, &pod); err != nil {
			if apierrors.IsNotFound(err) {
				continue // gone: its endpoint goes too
			}
			return fmt.Errorf("get consumer pod %s: %w", p, err)
		}
		v, has := pod.Annotations[served.Annotation]
		var rep served.Report
		if has {
			if rep, err = served.Parse(v); err != nil {
				log.Info("ignoring a consumer pod's unreadable served report", "pod", p, "err", err.Error())
				has = false
			}
		}
		if !has {
			notTracked = append(notTracked, pname)
			counts[v1alpha1.ConsumerNotTracked]++
			for _, k := range keys {
				consumers = append(consumers, v1alpha1.Consumer{Pod: p, Key: k, State: v1alpha1.ConsumerNotTracked})
			}
			continue
		}
		tracked++
		all := true
		since := metav1.NewTime(rep.At)
		for _, k := range keys {
			c := v1alpha1.Consumer{Pod: p, Key: k, Served: rep.Keys[k], State: v1alpha1.ConsumerSynced, Since: &since}
			if c.Served != current[k] {
				c.State, all = v1alpha1.ConsumerStale, false
			}
			consumers = append(consumers, c)
		}
		if all {
			synced++
			counts[v1alpha1.ConsumerSynced]++
		} else {
			stale = append(stale, pname)
			counts[v1alpha1.ConsumerStale]++
		}
	}
	route.Status.Consumers = consumers
	r.applied.setCounts(key, counts)
	if tracked == 0 {
		route.Status.Synced = ""
		msg := fmt.Sprintf("none of the %d pods behind %s reports what it serves (run their reload sidecars with --pod-name)", len(notTracked), svc)
		if len(notTracked) == 0 {
			msg = fmt.Sprintf("no pod behind %s", svc)
		}
		setCondition(route, TypeApplied, metav1.ConditionUnknown, ReasonNotTracked, msg)
		return nil
	}
	route.Status.Synced = fmt.Sprintf("%d/%d", synced, tracked)
	extra := ""
	if len(notTracked) > 0 {
		extra = fmt.Sprintf("; not tracked (no served report): %s", strings.Join(notTracked, ", "))
	}
	if len(stale) > 0 {
		setCondition(route, TypeApplied, metav1.ConditionFalse, ReasonStale, fmt.Sprintf(
			"%d of %d consumer pods behind %s do not serve the current %s yet: %s%s",
			len(stale), tracked, svc, strings.Join(keys, ", "), strings.Join(stale, ", "), extra))
		return nil
	}
	setCondition(route, TypeApplied, metav1.ConditionTrue, ReasonSynced, fmt.Sprintf(
		"%d/%d consumer pods behind %s serve the current %s%s", synced, tracked, svc, strings.Join(keys, ", "), extra))
	r.applied.converged(key, current, time.Now())
	return nil
}

// appliedTracker remembers, per route, when the content its consumers
// should serve changed, to observe autoconfig_applied_seconds once they
// all do; and the consumer counts it exported.
type appliedTracker struct {
	mu   sync.Mutex
	want map[types.NamespacedName]*appliedWant
}

type appliedWant struct {
	ids      map[string]string
	since    time.Time
	observed bool
	counts   map[string]int
}

func (a *appliedTracker) entry(key types.NamespacedName) *appliedWant {
	if a.want == nil {
		a.want = map[types.NamespacedName]*appliedWant{}
	}
	w := a.want[key]
	if w == nil {
		w = &appliedWant{}
		a.want[key] = w
	}
	return w
}

// changed records that the route's keys in its nginx output now hold ids
// (a write decided at at): the clock of applied_seconds starts.
func (a *appliedTracker) changed(key types.NamespacedName, ids map[string]string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.entry(key)
	if maps.Equal(w.ids, ids) {
		return
	}
	w.ids, w.since, w.observed = ids, at, false
}

// converged records that every tracked consumer serves ids.
func (a *appliedTracker) converged(key types.NamespacedName, ids map[string]string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.entry(key)
	if w.observed || w.since.IsZero() || !maps.Equal(w.ids, ids) {
		return
	}
	w.observed = true
	appliedSeconds.Observe(now.Sub(w.since).Seconds())
}

func (a *appliedTracker) setCounts(key types.NamespacedName, counts map[string]int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.entry(key)
	w.counts = counts
	for _, s := range []string{v1alpha1.ConsumerSynced, v1alpha1.ConsumerStale, v1alpha1.ConsumerNotTracked} {
		consumerPodsGauge.WithLabelValues(key.Namespace, key.Name, s).Set(float64(counts[s]))
	}
}

func (a *appliedTracker) forget(key types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.want, key)
	for _, s := range []string{v1alpha1.ConsumerSynced, v1alpha1.ConsumerStale, v1alpha1.ConsumerNotTracked} {
		consumerPodsGauge.DeleteLabelValues(key.Namespace, key.Name, s)
	}
}

// consumerPodHandler re-reconciles the routes a consumer pod's served
// report concerns when it changes: the routes whose keys changed in it,
// among those whose spec.nginx.service has the pod behind it.
func (r *Reconciler) consumerPodHandler() handler.EventHandler {
	enqueue := func(ctx context.Context, pod client.Object, keys map[string]bool, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		var sl discoveryv1.EndpointSliceList
		if err := r.Client.List(ctx, &sl, client.MatchingFields{discovery.IndexSlicePod: pod.GetNamespace() + "/" + pod.GetName()}); err != nil {
			return
		}
		seen := map[types.NamespacedName]bool{}
		for i := range sl.Items {
			svc := sl.Items[i].Labels[discoveryv1.LabelServiceName]
			for _, rt := range r.routesBy(ctx, discovery.IndexRouteService, sl.Items[i].Namespace+"/"+svc) {
				k := client.ObjectKeyFromObject(&rt)
				if seen[k] || rt.Spec.Nginx.Service == "" || compiler.ResolveRef(compilerRoute(&rt), rt.Spec.Nginx.Service) != sl.Items[i].Namespace+"/"+svc {
					continue
				}
				if keys != nil && !slices.ContainsFunc(r.owned.keysIn(k, compiler.ResolveRef(compilerRoute(&rt), rt.Spec.Nginx.OutputConfigMap)), func(key string) bool { return keys[key] }) {
					continue
				}
				seen[k] = true
				q.Add(reconcile.Request{NamespacedName: k})
			}
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if _, ok := e.Object.GetAnnotations()[served.Annotation]; ok {
				enqueue(ctx, e.Object, nil, q)
			}
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			before, after := e.ObjectOld.GetAnnotations()[served.Annotation], e.ObjectNew.GetAnnotations()[served.Annotation]
			if before == after {
				return
			}
			old, err1 := served.Parse(before)
			cur, err2 := served.Parse(after)
			if err1 != nil || err2 != nil {
				enqueue(ctx, e.ObjectNew, nil, q)
				return
			}
			changed := map[string]bool{}
			for k, v := range cur.Keys {
				if old.Keys[k] != v {
					changed[k] = true
				}
			}
			for k := range old.Keys {
				if _, ok := cur.Keys[k]; !ok {
					changed[k] = true
				}
			}
			if len(changed) > 0 {
				enqueue(ctx, e.ObjectNew, changed, q)
			}
		},
	}
}
