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
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/internal/informer"
	"github.com/modelsphere/autoconfig/internal/scaler"
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

// consumerGroup is one kind of consumer of the route's output: the nginx
// entry (spec.nginx.service or .selector; its keys in
// spec.nginx.outputConfigMap) or the CART (spec.cart.service or
// .selector; its config.yaml in spec.cart.outputConfigMap).
type consumerGroup struct {
	kind      string // "nginx" or "cart"
	service   string // resolved ns/name, or ""
	selector  string // pod label selector in the route's namespace, or ""
	configMap string // resolved ns/name of the output ConfigMap
}

func (g consumerGroup) String() string {
	if g.service != "" {
		return g.kind + " Service " + g.service
	}
	return g.kind + " pods " + g.selector
}

// consumerGroups are the route's consumer groups that name their pods.
func consumerGroups(route *v1alpha1.ModelRoute) []consumerGroup {
	cr := compilerRoute(route)
	var out []consumerGroup
	add := func(kind, svc, sel, cm string) {
		switch {
		case svc != "":
			out = append(out, consumerGroup{kind: kind, service: compiler.ResolveRef(cr, svc), configMap: compiler.ResolveRef(cr, cm)})
		case sel != "":
			out = append(out, consumerGroup{kind: kind, selector: sel, configMap: compiler.ResolveRef(cr, cm)})
		}
	}
	add("nginx", route.Spec.Nginx.Service, route.Spec.Nginx.Selector, route.Spec.Nginx.OutputConfigMap)
	if c := route.Spec.Cart; c != nil {
		add("cart", c.Service, c.Selector, c.OutputConfigMap)
	}
	return out
}

// consumers is the consumers' served state: which of a route's consumer
// pods serve its current output, from their served reports (the
// consumers step), and which routes a changed report concerns (podHandler).
type consumers struct {
	// client reads the cache.
	client client.Reader
	// namespaces are the watched namespaces (empty: all).
	namespaces []string
	// routes is what the controller remembers of the routes: what each
	// last wrote, the parsed reports, the convergence clocks.
	routes *RouteState
	// pods reads the consumer pods (their pod caches).
	pods podReaderFunc
}

// podsOf are the pods ("ns/name") of g: behind its Service (the
// targetRef of its EndpointSlices' endpoints) or selected in the route's
// namespace; not terminating. pr is the pod cache to read them from: the
// one of the pods the Service's selector (or g's) matches. ok is false
// when they cannot be read here (a namespace the controller does not
// watch).
func (cs *consumers) podsOf(ctx context.Context, route *v1alpha1.ModelRoute, g consumerGroup) (pods []string, pr client.Reader, ok bool, err error) {
	if g.service != "" {
		ns, name, _ := strings.Cut(g.service, "/")
		if !watched(cs.namespaces, ns) {
			return nil, nil, false, nil
		}
		sns, sel, err := servicePods(ctx, cs.client, g.service)
		if err != nil {
			return nil, nil, false, err
		}
		var sl discoveryv1.EndpointSliceList
		if err := cs.client.List(ctx, &sl, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: name}); err != nil {
			return nil, nil, false, fmt.Errorf("list endpointslices of %s: %w", g.service, err)
		}
		for i := range sl.Items {
			for _, p := range discovery.SlicePods(&sl.Items[i]) {
				// The pods a Service's endpoints point to are in its
				// namespace (the cache holds only those).
				if pns, _, _ := strings.Cut(p, "/"); pns == sns {
					pods = append(pods, p)
				}
			}
		}
		if len(pods) > 0 {
			if pr, err = cs.pods(ctx, sns, sel); err != nil {
				return nil, nil, false, fmt.Errorf("pods of %s: %w", g, err)
			}
		}
	} else {
		sel, err := labels.Parse(g.selector)
		if err != nil {
			return nil, nil, false, nil // the schema refuses it; nothing to track
		}
		if pr, err = cs.pods(ctx, route.Namespace, g.selector); err != nil {
			return nil, nil, false, fmt.Errorf("pods of %s: %w", g, err)
		}
		var pl corev1.PodList
		if err := pr.List(ctx, &pl, client.InNamespace(route.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
			return nil, nil, false, fmt.Errorf("list pods of %s: %w", g, err)
		}
		for _, p := range pl.Items {
			if p.DeletionTimestamp.IsZero() {
				pods = append(pods, p.Namespace+"/"+p.Name)
			}
		}
	}
	slices.Sort(pods)
	return slices.Compact(pods), pr, true, nil
}

// reconcileConsumers sets status.consumers, status.synced and Applied: for
// each consumer pod (consumerGroups) and each of the route's keys in its
// group's output ConfigMap, whether the pod's served report names the
// content the route last wrote there.
func (r *Reconciler) reconcileConsumers(ctx context.Context, st *state) (bool, error) {
	if r.preview {
		return false, nil // reports the consumers, writes nothing
	}
	return false, r.consumers.status(ctx, st)
}

// consumerTally is what the consumer pods of a route report, gathered
// group by group (consumers.status) and then summed up in the Applied
// condition (applied).
type consumerTally struct {
	consumers []v1alpha1.Consumer
	// groups are the consumer groups looked at; unwatched those in a
	// namespace the controller does not watch.
	groups, unwatched []string
	// keys are the route's keys held in the groups' ConfigMaps; current
	// is "cm\x00key" → the ID of what the route last wrote there.
	keys    []string
	current map[string]string
	// tracked pods report what they serve; synced of them serve every key
	// as written; stale and notTracked name the others.
	tracked, synced   int
	stale, notTracked []string
	counts            map[string]int // by consumer state (metrics)
	// reports are the nginx consumer pods' served reports (scale to
	// zero's demand), each with whether the pod serves the route's
	// current output.
	reports []scaler.Report
}

// status is reconcileConsumers' work.
func (cs *consumers) status(ctx context.Context, st *state) error {
	route := st.route
	key := client.ObjectKeyFromObject(route)
	t := &consumerTally{current: map[string]string{}, counts: map[string]int{}}
	for _, g := range consumerGroups(route) {
		pods, pr, ok, err := cs.podsOf(ctx, route, g)
		if err != nil {
			return err
		}
		if !ok {
			t.unwatched = append(t.unwatched, g.String())
			continue
		}
		t.groups = append(t.groups, g.String())
		ids := map[string]string{}
		for k, sum := range cs.routes.rendered.sumsIn(key, g.configMap) {
			ids[k] = served.IDOfSum(sum)
			t.current[g.configMap+"\x00"+k] = ids[k]
		}
		if len(ids) == 0 {
			continue
		}
		if err := cs.tally(ctx, t, g, pr, pods, ids); err != nil {
			return err
		}
	}
	slices.SortFunc(t.consumers, func(a, b v1alpha1.Consumer) int {
		return strings.Compare(a.Pod+"\x00"+a.Key, b.Pod+"\x00"+b.Key)
	})
	route.Status.Consumers = t.consumers
	st.reports = t.reports
	if len(t.groups) == 0 {
		cs.routes.applied.forget(key) // nothing tracked: no series, no clock
	} else {
		cs.routes.applied.setCounts(key, t.counts)
		cs.routes.applied.changed(key, t.current, st.started)
	}
	slices.Sort(t.keys)
	t.keys = slices.Compact(t.keys)
	if t.applied(route) {
		cs.routes.applied.converged(key, t.current, time.Now())
	}
	return nil
}

// tally adds what each of a group's pods (read through pr) serves of
// ids (the route's keys in the group's ConfigMap → the ID last written).
func (cs *consumers) tally(ctx context.Context, t *consumerTally, g consumerGroup, pr client.Reader, pods []string, ids map[string]string) error {
	keys := slices.Sorted(maps.Keys(ids))
	t.keys = append(t.keys, keys...)
	for _, p := range pods {
		pns, pname, _ := strings.Cut(p, "/")
		var pod corev1.Pod
		if err := pr.Get(ctx, types.NamespacedName{Namespace: pns, Name: pname}, &pod); err != nil {
			if apierrors.IsNotFound(err) {
				continue // gone: its endpoint goes too
			}
			return fmt.Errorf("get consumer pod %s: %w", p, err)
		}
		rep, has, err := cs.routes.reports.of(&pod)
		if err != nil {
			ctrl.LoggerFrom(ctx).Info("ignoring a consumer pod's unreadable served report", "pod", p, "err", err.Error())
		}
		if !has {
			t.notTracked = append(t.notTracked, pname)
			t.counts[v1alpha1.ConsumerNotTracked]++
			for _, k := range keys {
				t.consumers = append(t.consumers, v1alpha1.Consumer{Pod: p, Key: k, State: v1alpha1.ConsumerNotTracked})
			}
			continue
		}
		t.tracked++
		all := true
		since := metav1.NewTime(rep.At)
		for _, k := range keys {
			c := v1alpha1.Consumer{Pod: p, Key: k, Served: rep.Keys[k], State: v1alpha1.ConsumerSynced, Since: &since}
			if c.Served != ids[k] {
				c.State, all = v1alpha1.ConsumerStale, false
			}
			t.consumers = append(t.consumers, c)
		}
		if g.kind == "nginx" {
			t.reports = append(t.reports, scaler.Report{Pod: p, Serving: all, Report: rep})
		}
		if all {
			t.synced++
			t.counts[v1alpha1.ConsumerSynced]++
		} else {
			t.stale = append(t.stale, pname)
			t.counts[v1alpha1.ConsumerStale]++
		}
	}
	return nil
}

// applied sets status.synced and the Applied condition from the tally;
// it reports whether every tracked pod serves the current output.
func (t *consumerTally) applied(route *v1alpha1.ModelRoute) bool {
	extra := ""
	if len(t.notTracked) > 0 {
		extra = fmt.Sprintf("; not tracked (no served report): %s", strings.Join(t.notTracked, ", "))
	}
	if len(t.unwatched) > 0 {
		extra += fmt.Sprintf("; not tracked (namespace not watched): %s", strings.Join(t.unwatched, ", "))
	}
	switch {
	case len(t.groups) == 0 && len(t.unwatched) == 0:
		route.Status.Synced = ""
		setCondition(route, TypeApplied, metav1.ConditionUnknown, ReasonNotTracked,
			"the route names no consumer pods: set spec.nginx.service (the openresty entry's Service) or spec.nginx.selector, and run the consumers' reload sidecars with --pod-name")
	case len(t.keys) == 0 && len(t.groups) > 0:
		route.Status.Synced = ""
		setCondition(route, TypeApplied, metav1.ConditionUnknown, ReasonNotWritten, "the route holds none of its keys yet")
	case t.tracked == 0:
		route.Status.Synced = ""
		setCondition(route, TypeApplied, metav1.ConditionUnknown, ReasonNotTracked, fmt.Sprintf(
			"no consumer pod of %s reports what it serves (run their reload sidecars with --pod-name)%s", strings.Join(append(t.groups, t.unwatched...), ", "), extra))
	case len(t.stale) > 0:
		route.Status.Synced = fmt.Sprintf("%d/%d", t.synced, t.tracked)
		setCondition(route, TypeApplied, metav1.ConditionFalse, ReasonStale, fmt.Sprintf(
			"%d of %d consumer pods of %s do not serve the current %s yet: %s%s",
			len(t.stale), t.tracked, strings.Join(t.groups, ", "), strings.Join(t.keys, ", "), strings.Join(t.stale, ", "), extra))
	default:
		route.Status.Synced = fmt.Sprintf("%d/%d", t.synced, t.tracked)
		setCondition(route, TypeApplied, metav1.ConditionTrue, ReasonSynced, fmt.Sprintf(
			"%d/%d consumer pods of %s serve the current %s%s", t.synced, t.tracked, strings.Join(t.groups, ", "), strings.Join(t.keys, ", "), extra))
		return true
	}
	return false
}

// reportCache keeps the parsed served report of each consumer pod version:
// a report lists every key the pod serves (a thousand routes share one
// openresty ConfigMap), and every route's reconcile reads it.
type reportCache struct {
	mu sync.Mutex
	m  map[types.UID]parsedReport
}

type parsedReport struct {
	value string
	rep   served.Report
	err   error
}

// of is pod's report; has is false without one (or an unreadable one,
// with err).
func (c *reportCache) of(pod *corev1.Pod) (served.Report, bool, error) {
	v, ok := pod.Annotations[served.Annotation]
	if !ok {
		return served.Report{}, false, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[pod.UID]; ok && e.value == v {
		return e.rep, e.err == nil, e.err
	}
	rep, err := served.Parse(v)
	if c.m == nil || len(c.m) > 4096 {
		c.m = map[types.UID]parsedReport{} // pods come and go: start over now and then
	}
	c.m[pod.UID] = parsedReport{value: v, rep: rep, err: err}
	return rep, err == nil, err
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

// podHandler re-reconciles the routes a consumer pod's served
// report concerns when it changes: the routes whose keys changed in it,
// among those whose spec.nginx.service has the pod behind it.
func (cs *consumers) podHandler() handler.EventHandler {
	enqueue := func(ctx context.Context, pod client.Object, keys map[string]bool, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		// The slices of the pod's namespace that point to it. Not an
		// index: one of every slice's pods cost 6 MB at 10,000 pods in the
		// scale benchmark, for the few consumer pods; a report changes
		// once per reload.
		var all discoveryv1.EndpointSliceList
		if err := cs.client.List(ctx, &all, client.InNamespace(pod.GetNamespace()), client.UnsafeDisableDeepCopy); err != nil {
			return
		}
		me := pod.GetNamespace() + "/" + pod.GetName()
		var sl discoveryv1.EndpointSliceList
		for i := range all.Items {
			if _, ok := slices.BinarySearch(discovery.SlicePods(&all.Items[i]), me); ok {
				sl.Items = append(sl.Items, all.Items[i])
			}
		}
		seen := map[types.NamespacedName]bool{}
		for i := range sl.Items {
			svc := sl.Items[i].Labels[discoveryv1.LabelServiceName]
			for _, rt := range informer.RoutesBy(ctx, cs.client, discovery.IndexRouteService, sl.Items[i].Namespace+"/"+svc) {
				k := client.ObjectKeyFromObject(&rt)
				if seen[k] {
					continue
				}
				for _, g := range consumerGroups(&rt) {
					if g.service != sl.Items[i].Namespace+"/"+svc {
						continue
					}
					if keys != nil && !slices.ContainsFunc(cs.routes.rendered.keysIn(k, g.configMap), func(key string) bool { return keys[key] }) {
						continue
					}
					seen[k] = true
					q.Add(reconcile.Request{NamespacedName: k})
					break
				}
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
			} else if !maps.Equal(old.Demand, cur.Demand) {
				// The engine's demand (scale to zero): the routes the
				// pod serves.
				enqueue(ctx, e.ObjectNew, nil, q)
			}
		},
	}
}
