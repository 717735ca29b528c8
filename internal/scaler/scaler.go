// Package scaler wakes a scale-to-zero route's workload and puts it back
// to zero (spec.scaleToZero). Decide is the rule, pure: wake a target at 0
// replicas when a consumer's engine that serves the route's current
// output holds requests for it; with idleAfter, scale it to 0 once no
// request is open on any consumer and the last one ended that long ago
// (and one DemandGranularity more, the step of the reported time), unless
// another autoscaler owns the replica count. Backs is the other rule: the
// target must be the workload behind the route's discovery. Scaler reads and writes the
// target's scale subresource (never the workload itself: the controller's
// RBAC is deployments/scale and statefulsets/scale) and finds the
// HorizontalPodAutoscalers and KEDA ScaledObjects that target it.
//
// The demand comes from the consumers' served reports (internal/served:
// the reload sidecar copies the engine's GET /demand into its Pod's
// annotation), so it needs no channel of its own.
package scaler

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/served"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// Report is one consumer pod's served report as the scale step reads it.
type Report struct {
	// Pod is the consumer pod ("ns/name").
	Pod string
	// Serving: the pod serves the route's current output (every key of
	// the route as last written). Only a serving pod's held requests
	// wake the target: a stale or foreign report wakes nothing.
	Serving bool
	served.Report
}

// Demand is a route's demand over its consumer pods' reports.
type Demand struct {
	// Waiting are the requests held on the serving pods (they wake the
	// target).
	Waiting int
	// Ignored are the requests held on pods that do not serve the
	// route's current output (they wake nothing).
	Ignored int
	// Open are the requests open (held, waiting for their first byte or
	// streaming) on any consumer pod: while one is, the target is not
	// scaled to 0.
	Open int
	// Last is the latest last request (arrival or end) of any pod.
	Last time.Time
	// StepSeconds is the largest step of Last the reports give.
	StepSeconds float64
	// Stale names the pods whose report stopped: its DemandAt is older
	// than served.DemandStaleSteps steps (the sidecar no longer reads its
	// engine). While one is, the target is not scaled to 0.
	Stale []string
}

// Aggregate is route's demand over the consumer pods' reports at now.
func Aggregate(reports []Report, route string, now time.Time) Demand {
	var d Demand
	for _, r := range reports {
		rd, ok := r.Demand[route]
		step := served.DemandGranularity
		if ok && rd.StepSeconds > 0 {
			step = time.Duration(rd.StepSeconds * float64(time.Second))
		}
		if !r.DemandAt.IsZero() && now.Sub(r.DemandAt) > served.DemandStaleSteps*step {
			d.Stale = append(d.Stale, r.Pod)
		}
		if !ok {
			continue
		}
		if r.Serving {
			d.Waiting += rd.Waiting
		} else {
			d.Ignored += rd.Waiting
		}
		d.Open += max(rd.Open, rd.Waiting)
		if rd.Last.After(d.Last) {
			d.Last = rd.Last
		}
		d.StepSeconds = max(d.StepSeconds, rd.StepSeconds)
	}
	sort.Strings(d.Stale)
	return d
}

// Input is what Decide needs about one route.
type Input struct {
	// Spec is the route's spec.scaleToZero (defaulted).
	Spec *routespec.ScaleToZero
	// Replicas is the target's spec.replicas (its scale subresource).
	Replicas int32
	// Demand is Aggregate over the route's consumer pods.
	Demand Demand
	// Autoscalers name the other autoscalers of the target
	// (HorizontalPodAutoscaler/<name>, ScaledObject/<name>).
	Autoscalers []string
	// Awake is when the target was last woken, or first seen with
	// replicas, by this controller: a model that was just woken is not
	// put back to sleep before its first request could arrive.
	Awake time.Time
	// Now is the time of the decision.
	Now time.Time
	// Granularity is the step of the reported last request when the
	// reports do not say (Demand.StepSeconds).
	Granularity time.Duration
}

// Decision is what to do with the target.
type Decision struct {
	// Scale is true when the target's replicas are to be set to
	// Replicas.
	Scale    bool
	Replicas int32
	// Why says why, for the event and the log.
	Why string
	// After, when > 0, is when to decide again with no other change (the
	// idle deadline).
	After time.Duration
	// IdleRefused names the autoscalers that make idleAfter refused (two
	// owners of one replica count fight).
	IdleRefused []string
	// KeptUp says why an idle deadline does not apply now (requests are
	// open, or a consumer pod's report stopped); "" otherwise.
	KeptUp string
}

// Decide is the scale-to-zero rule. A target at 0 replicas with requests
// waiting on a serving consumer pod is woken to wakeReplicas (also when
// another autoscaler targets it: an HPA does nothing at 0 replicas). A
// target with replicas, with idleAfter and no other autoscaler, no request
// open on any consumer pod, no consumer pod whose report stopped, and no
// request since idleAfter + Granularity (counted from the later of the
// last request's end and Awake) is scaled to 0.
func Decide(in Input) Decision {
	s := in.Spec
	if s == nil {
		return Decision{}
	}
	if in.Replicas == 0 {
		if in.Demand.Waiting > 0 {
			wake := min(max(s.WakeReplicas, routespec.DefaultWakeReplicas), routespec.MaxWakeReplicas)
			return Decision{Scale: true, Replicas: wake, Why: fmt.Sprintf("%d request(s) held at zero replicas: woken to %d", in.Demand.Waiting, wake)}
		}
		return Decision{}
	}
	if s.IdleAfter == "" {
		return Decision{}
	}
	if len(in.Autoscalers) > 0 {
		return Decision{IdleRefused: in.Autoscalers}
	}
	step := in.Granularity
	if in.Demand.StepSeconds > 0 {
		step = time.Duration(in.Demand.StepSeconds * float64(time.Second))
	}
	if open := max(in.Demand.Open, in.Demand.Waiting+in.Demand.Ignored); open > 0 {
		// The end of the last open request is reported at once: no
		// timer needed.
		return Decision{KeptUp: fmt.Sprintf("%d request(s) open", open)}
	}
	if len(in.Demand.Stale) > 0 {
		return Decision{After: step, KeptUp: fmt.Sprintf(
			"the demand report of consumer pod(s) %s stopped (not rewritten for %d steps of %s: its reload sidecar does not read the engine), so an open request there cannot be ruled out",
			strings.Join(in.Demand.Stale, ", "), served.DemandStaleSteps, step)}
	}
	idle := time.Duration(routespec.Seconds(s.IdleAfter)) * time.Second
	last := in.Demand.Last
	if in.Awake.After(last) {
		last = in.Awake
	}
	if last.IsZero() {
		return Decision{}
	}
	deadline := last.Add(idle + step)
	if in.Now.Before(deadline) {
		return Decision{After: deadline.Sub(in.Now)}
	}
	return Decision{Scale: true, Replicas: 0, Why: fmt.Sprintf("no request open, none since %s (idleAfter %s): scaled to 0", last.UTC().Format(time.RFC3339), s.IdleAfter)}
}

// Namespace is where a route's target lives: the namespace of
// spec.discovery's Service, or the route's for a selector.
func Namespace(spec *routespec.Spec, routeNamespace string) string {
	if spec.Discovery.Service != "" {
		ns, _ := routespec.SplitRef(spec.Discovery.Service, routeNamespace)
		return ns
	}
	if routeNamespace == "" {
		return "default"
	}
	return routeNamespace
}

// Scaler reads and writes targets' scale subresources and remembers when
// each target was woken.
type Scaler struct {
	// Client writes the scale subresource.
	Client client.Client
	// Reader lists autoscalers (uncached: the controller runs no informer
	// for them).
	Reader client.Reader

	mu    sync.Mutex
	awake map[types.NamespacedName]time.Time
}

// target is the workload object of t (only its kind, namespace and name
// are used).
func target(ns string, t routespec.ScaleTarget) (client.Object, error) {
	switch t.Kind {
	case routespec.KindDeployment:
		return &appsv1.Deployment{ObjectMeta: objectMeta(ns, t.Name)}, nil
	case routespec.KindStatefulSet:
		return &appsv1.StatefulSet{ObjectMeta: objectMeta(ns, t.Name)}, nil
	}
	return nil, fmt.Errorf("scaleToZero.target.kind %q is not Deployment or StatefulSet", t.Kind)
}

// PodLabels are the labels of the target's pod template (read around
// the cache: the controller keeps no informer on workloads). A target
// that does not exist is a NotFound error.
func (s *Scaler) PodLabels(ctx context.Context, ns string, t routespec.ScaleTarget) (map[string]string, error) {
	obj, err := target(ns, t)
	if err != nil {
		return nil, err
	}
	if err := s.Reader.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return nil, err
	}
	switch w := obj.(type) {
	case *appsv1.Deployment:
		return w.Spec.Template.Labels, nil
	case *appsv1.StatefulSet:
		return w.Spec.Template.Labels, nil
	}
	return nil, nil
}

// Backs says whether a workload whose pods carry podLabels is behind a
// route that discovers by selector sel (a Service's selector, or the
// route's own spec.discovery.selector): "" when sel selects them, else
// why not. An empty selector selects nothing here: a Service without one
// has its endpoints written by hand, so no workload is shown to be its.
func Backs(podLabels map[string]string, sel labels.Selector, source string) string {
	if sel == nil || sel.Empty() {
		return fmt.Sprintf("%s has no pod selector, so no workload can be shown to be behind it", source)
	}
	if !sel.Matches(labels.Set(podLabels)) {
		return fmt.Sprintf("its pod template's labels {%s} are not selected by %s (selector %s)", labels.Set(podLabels), source, sel)
	}
	return ""
}

// Replicas is the target's spec.replicas, from its scale subresource.
func (s *Scaler) Replicas(ctx context.Context, ns string, t routespec.ScaleTarget) (int32, error) {
	obj, err := target(ns, t)
	if err != nil {
		return 0, err
	}
	var sc autoscalingv1.Scale
	if err := s.Client.SubResource("scale").Get(ctx, obj, &sc); err != nil {
		return 0, err
	}
	return sc.Spec.Replicas, nil
}

// SetReplicas sets the target's spec.replicas through its scale
// subresource (a merge patch: no read-modify-write race with the
// workload's own controller).
func (s *Scaler) SetReplicas(ctx context.Context, ns string, t routespec.ScaleTarget, n int32) error {
	obj, err := target(ns, t)
	if err != nil {
		return err
	}
	patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, n))
	return s.Client.SubResource("scale").Patch(ctx, obj, patch)
}

// MarkAwake records that the target of route (a namespaced name) has
// replicas since at (when the controller woke it, or first saw it so);
// it keeps the earliest time of the current awake spell. Asleep clears
// it.
func (s *Scaler) MarkAwake(route types.NamespacedName, at time.Time, woken bool) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.awake == nil {
		s.awake = map[types.NamespacedName]time.Time{}
	}
	if t, ok := s.awake[route]; ok && !woken {
		return t
	}
	s.awake[route] = at
	return at
}

// Asleep forgets the awake time of route (its target is at 0 or the route
// is gone).
func (s *Scaler) Asleep(route types.NamespacedName) {
	s.mu.Lock()
	delete(s.awake, route)
	s.mu.Unlock()
}

// ScaledObjectGVK is the list kind of KEDA's ScaledObject; a cluster without KEDA has no
// such kind, which is not an error.
var ScaledObjectGVK = schema.GroupVersionKind{Group: "keda.sh", Version: "v1alpha1", Kind: "ScaledObjectList"}

// Autoscalers names the HorizontalPodAutoscalers and KEDA ScaledObjects
// in ns whose scale target is t, sorted.
func (s *Scaler) Autoscalers(ctx context.Context, ns string, t routespec.ScaleTarget) ([]string, error) {
	var out []string
	var hpas autoscalingv2.HorizontalPodAutoscalerList
	if err := s.Reader.List(ctx, &hpas, client.InNamespace(ns)); err != nil && !meta.IsNoMatchError(err) {
		return nil, fmt.Errorf("list HorizontalPodAutoscalers in %s: %w", ns, err)
	}
	for _, h := range hpas.Items {
		ref := h.Spec.ScaleTargetRef
		if ref.Kind == t.Kind && ref.Name == t.Name && groupOf(ref.APIVersion) == "apps" {
			out = append(out, "HorizontalPodAutoscaler/"+h.Name)
		}
	}
	var sos unstructured.UnstructuredList
	sos.SetGroupVersionKind(ScaledObjectGVK)
	if err := s.Reader.List(ctx, &sos, client.InNamespace(ns)); err != nil {
		if !meta.IsNoMatchError(err) && !isNotFound(err) {
			return nil, fmt.Errorf("list KEDA ScaledObjects in %s: %w", ns, err)
		}
	}
	for _, so := range sos.Items {
		name, _, _ := unstructured.NestedString(so.Object, "spec", "scaleTargetRef", "name")
		kind, _, _ := unstructured.NestedString(so.Object, "spec", "scaleTargetRef", "kind")
		if kind == "" {
			kind = routespec.KindDeployment // KEDA's default
		}
		if name == t.Name && kind == t.Kind {
			out = append(out, "ScaledObject/"+so.GetName())
		}
	}
	sort.Strings(out)
	return out, nil
}

// groupOf is the group of an apiVersion ("apps/v1" → "apps", "v1" → "").
func groupOf(apiVersion string) string {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return ""
	}
	return gv.Group
}
