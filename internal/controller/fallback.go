package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// The fallback Service of a FailOpen route discovered by selector
// (docs/failure-modes.md). Such a route has no Service VIP, so the
// controller creates and owns a ClusterIP Service with the discovery
// selector and the backend port; its ClusterIP feeds the backend-svc tier,
// the static last resort kube-proxy keeps right even while autoconfig is
// down and pod IPs are stale.
//
// RBAC: services create/patch/delete (server-side apply) in the routes'
// namespaces, only for this (Helm value failOpen.manageFallbackServices;
// without it such routes report FallbackServiceConflict/NotPermitted and
// render no VIP tier).
//
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;patch;delete

const (
	// FallbackSuffix ends every fallback Service name.
	FallbackSuffix = "-fallback"
	// FallbackForAnnotation names the owning route ("ns/name") on a
	// fallback Service; the controller owner reference (UID) is what
	// decides ownership, the annotation is for people and for the index.
	FallbackForAnnotation = "routing.modelsphere.dev/fallback-for"
	// ManagedByLabel marks objects autoconfig created.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	// ManagedByValue is ManagedByLabel's value.
	ManagedByValue = "autoconfig"
	// FallbackPortName is the fallback Service's only port name.
	FallbackPortName = "http"

	// IndexRouteFallbackService indexes selector routes by the "ns/name"
	// of their fallback Service (whatever their failure mode), so events
	// on that Service — ours or a foreign one with the same name — reach
	// the route.
	IndexRouteFallbackService = "route.routing.modelsphere.dev/fallback-service"

	// TypeFallbackServiceConflict is present (True) while a FailOpen
	// selector route cannot have its owned fallback Service; the route
	// then renders no VIP tier. Absent otherwise.
	TypeFallbackServiceConflict = "FallbackServiceConflict"
	// ReasonServiceNotOwned: a Service with the fallback name exists and is
	// not controlled by this route; it is never modified.
	ReasonServiceNotOwned = "ServiceNotOwned"
	// ReasonServiceNotPermitted: RBAC forbids writing Services.
	ReasonServiceNotPermitted = "ServiceWriteNotPermitted"
	// ReasonSelectorNotExpressible: the discovery selector uses set-based
	// requirements a Service selector cannot express.
	ReasonSelectorNotExpressible = "SelectorNotExpressible"
)

// FallbackServiceName is "<route>-fallback" when that is a valid Service
// name (DNS-1035 label: at most 63 characters of a-z, 0-9 and '-', starting
// with a letter); otherwise a sanitized, shortened route name plus a hash
// of the full name, so two routes never share a fallback Service.
func FallbackServiceName(route string) string {
	name := route + FallbackSuffix
	if len(validation.IsDNS1035Label(name)) == 0 {
		return name
	}
	sum := sha256.Sum256([]byte(route))
	hash := hex.EncodeToString(sum[:])[:10]
	var b strings.Builder
	for _, c := range strings.ToLower(route) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			b.WriteRune(c)
		} else if b.Len() > 0 {
			b.WriteByte('-')
		}
	}
	base := strings.TrimLeft(b.String(), "0123456789-")
	if maxBase := 63 - len(FallbackSuffix) - len(hash) - 2; len(base) > maxBase {
		base = base[:maxBase]
	}
	base = strings.Trim(base, "-")
	if base == "" {
		return "r" + hash + FallbackSuffix
	}
	return base + "-" + hash + FallbackSuffix
}

// wantsFallback: FailOpen with selector discovery (service discovery has a
// VIP of its own). It reads the raw spec: no defaults are involved.
func wantsFallback(route *v1alpha1.ModelRoute) bool {
	d := route.Spec.Discovery
	return route.Spec.FailureMode == v1alpha1.FailOpen && d.Service == "" && d.Selector != ""
}

// fallbackKey is the index value of a selector route (any failure mode).
func fallbackKey(route *v1alpha1.ModelRoute) []string {
	if route.Spec.Discovery.Service != "" || route.Spec.Discovery.Selector == "" {
		return nil
	}
	return []string{route.Namespace + "/" + FallbackServiceName(route.Name)}
}

// SetupFallbackIndex registers IndexRouteFallbackService.
func SetupFallbackIndex(ctx context.Context, idx client.FieldIndexer) error {
	if err := idx.IndexField(ctx, &v1alpha1.ModelRoute{}, IndexRouteFallbackService, func(o client.Object) []string {
		r, ok := o.(*v1alpha1.ModelRoute)
		if !ok {
			return nil
		}
		return fallbackKey(r)
	}); err != nil {
		return fmt.Errorf("index %s: %w", IndexRouteFallbackService, err)
	}
	return nil
}

// mapFallbackService maps a Service event to the selector routes whose
// fallback Service has that name.
func (r *Reconciler) mapFallbackService(ctx context.Context, o client.Object) []reconcile.Request {
	return requests(r.routesBy(ctx, IndexRouteFallbackService, o.GetNamespace()+"/"+o.GetName()))
}

// fallbackSelector turns a label selector string into a Service selector:
// only equality requirements (k=v, k==v, k in (v)) can be expressed.
func fallbackSelector(s string) (map[string]string, error) {
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("selector %q: %w", s, err)
	}
	reqs, _ := sel.Requirements()
	if len(reqs) == 0 {
		return nil, fmt.Errorf("selector %q selects every pod; a Service needs at least one key=value", s)
	}
	out := map[string]string{}
	for _, q := range reqs {
		vals := q.Values().UnsortedList()
		switch op := q.Operator(); {
		case (op == selection.Equals || op == selection.DoubleEquals || op == selection.In) && len(vals) == 1:
			out[q.Key()] = vals[0]
		default:
			return nil, fmt.Errorf("selector %q: requirement %q is set-based, and a Service selector holds only key=value pairs; use a selector of key=value pairs or discovery.service", s, q.String())
		}
	}
	return out, nil
}

// fallbackPort is spec.discovery.port, else the one TCP containerPort the
// selected pods declare (discovery.DerivePort, the rule discovery uses; pods
// without an IP count too: the Service selects them as well). 0 = not
// derivable yet.
func (r *Reconciler) fallbackPort(ctx context.Context, route *v1alpha1.ModelRoute) (int32, error) {
	d := route.Spec.Discovery
	if d.Port != 0 {
		return d.Port, nil
	}
	sel, err := labels.Parse(d.Selector)
	if err != nil {
		return 0, nil
	}
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(route.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return 0, fmt.Errorf("list pods %q in %s: %w", d.Selector, route.Namespace, err)
	}
	var live []*corev1.Pod
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			live = append(live, &pods.Items[i])
		}
	}
	port, _ := discovery.DerivePort(0, discovery.PodPorts(live...))
	return port, nil
}

// reconcileFallback is the reconcile step around reconcileFallbackService;
// it runs before discovery so a switch away from FailOpen cleans up even
// while the route has no backends.
func (r *Reconciler) reconcileFallback(ctx context.Context, st *state) (bool, error) {
	vip, err := r.reconcileFallbackService(ctx, st.route, st.spec)
	st.fallback = vip
	return false, err
}

// reconcileFallbackService makes the route's fallback Service match its
// spec and returns the VIP to use for the backend-svc tier (nil = none):
//
//   - not FailOpen+selector: delete the Service if this route controls it;
//   - FailOpen+selector: server-side apply it (field owner FieldOwner) when
//     absent or when its fields differ from the spec (a deleted Service is
//     recreated on the next reconcile: Service events reach the route
//     through IndexRouteFallbackService);
//   - a same-named Service this route does not control is never modified:
//     condition FallbackServiceConflict + a Warning event, no VIP.
//
// route is the live object (its status conditions are updated; the
// caller's deferred status patch writes them); spec is the validated copy.
func (r *Reconciler) reconcileFallbackService(ctx context.Context, route, spec *v1alpha1.ModelRoute) (*compiler.ServiceVIP, error) {
	log := ctrl.LoggerFrom(ctx)
	key := client.ObjectKey{Namespace: route.Namespace, Name: FallbackServiceName(route.Name)}
	if !wantsFallback(spec) {
		r.clearFallbackConflict(route)
		return nil, r.cleanupFallbackService(ctx, route)
	}
	selector, err := fallbackSelector(spec.Spec.Discovery.Selector)
	if err != nil {
		r.markFallbackConflict(route, ReasonSelectorNotExpressible, fmt.Sprintf(
			"no fallback Service for FailOpen: %v; the route renders no static Service VIP tier", err))
		return nil, nil
	}
	port, err := r.fallbackPort(ctx, spec)
	if err != nil {
		return nil, err
	}

	var svc corev1.Service
	err = r.Client.Get(ctx, key, &svc)
	if apierrors.IsNotFound(err) && r.APIReader != nil {
		// The cache may lag a Service just created by someone else: ask
		// the API server before an apply that would create ours.
		err = r.APIReader.Get(ctx, key, &svc)
	}
	var uid types.UID // apply precondition: the Service this route controls
	switch {
	case apierrors.IsNotFound(err):
		if port == 0 {
			// No pod yet (or ports ambiguous, which discovery reports):
			// pods are watched, so their arrival brings us back.
			r.clearFallbackConflict(route)
			return nil, nil
		}
	case err != nil:
		return nil, fmt.Errorf("get fallback service %s: %w", key, err)
	case !metav1.IsControlledBy(&svc, route):
		r.markFallbackConflict(route, ReasonServiceNotOwned, fmt.Sprintf(
			"Service %s exists and is not controlled by this route; autoconfig never modifies it, so the FailOpen route renders no static Service VIP tier. Delete or rename that Service to let autoconfig create its own", key))
		return nil, nil
	default:
		if port == 0 && len(svc.Spec.Ports) > 0 {
			port = svc.Spec.Ports[0].TargetPort.IntVal // keep the last known port
		}
		uid = svc.UID
	}
	want, err := r.fallbackApply(key, route, selector, port, uid)
	if err != nil {
		return nil, err
	}
	if uid == "" || !appliedFallback(&svc, want) {
		verb := "update"
		if uid == "" {
			verb = "create"
		}
		applied, err := r.applyFallback(ctx, want)
		if err != nil {
			return nil, r.fallbackWriteError(route, key, verb, err)
		}
		log.Info(verb+"d fallback service", "service", key.String(), "port", port, "selector", selector)
		svc = *applied
	}
	r.clearFallbackConflict(route)
	return discovery.ServiceVIP(&svc, port, FallbackPortName), nil
}

// FieldOwner is the server-side apply field manager of the fallback
// Services.
const FieldOwner = Name

// fallbackApply is the apply configuration of the route's fallback Service:
// exactly the fields this route decides (labels, annotation, controller
// reference, type, selector, port); the API server keeps the rest
// (clusterIP, others' labels). A non-empty uid makes the apply fail unless
// it reaches that Service (the one the route controls), and an apply
// without one creates it; ownership is forced, as the route controls the
// Service and its fields must follow the spec.
func (r *Reconciler) fallbackApply(key client.ObjectKey, route *v1alpha1.ModelRoute, selector map[string]string, port int32, uid types.UID) (*corev1ac.ServiceApplyConfiguration, error) {
	gvk, err := apiutil.GVKForObject(route, r.Client.Scheme())
	if err != nil {
		return nil, fmt.Errorf("own fallback service: %w", err)
	}
	spec := corev1ac.ServiceSpec().WithType(corev1.ServiceTypeClusterIP).WithSelector(selector)
	if port != 0 {
		spec.WithPorts(corev1ac.ServicePort().WithName(FallbackPortName).WithProtocol(corev1.ProtocolTCP).
			WithPort(port).WithTargetPort(intstr.FromInt32(port)))
	}
	svc := corev1ac.Service(key.Name, key.Namespace).
		WithLabels(map[string]string{ManagedByLabel: ManagedByValue}).
		WithAnnotations(map[string]string{FallbackForAnnotation: route.Namespace + "/" + route.Name}).
		WithOwnerReferences(metav1ac.OwnerReference().WithAPIVersion(gvk.GroupVersion().String()).WithKind(gvk.Kind).
			WithName(route.Name).WithUID(route.UID).WithController(true).WithBlockOwnerDeletion(true)).
		WithSpec(spec)
	if uid != "" {
		svc.WithUID(uid)
	}
	return svc, nil
}

// applyFallback applies want (server-side apply, field owner FieldOwner)
// and returns the Service as the API server now has it.
func (r *Reconciler) applyFallback(ctx context.Context, want *corev1ac.ServiceApplyConfiguration) (*corev1.Service, error) {
	if err := r.Client.Apply(ctx, want, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return nil, err
	}
	b, err := json.Marshal(want) // the API server's answer
	if err != nil {
		return nil, err
	}
	var svc corev1.Service
	if err := json.Unmarshal(b, &svc); err != nil {
		return nil, err
	}
	return &svc, nil
}

// appliedFallback says whether svc already has every field of want, so an
// apply would change nothing (and is skipped).
func appliedFallback(svc *corev1.Service, want *corev1ac.ServiceApplyConfiguration) bool {
	if svc.Labels[ManagedByLabel] != want.Labels[ManagedByLabel] ||
		svc.Annotations[FallbackForAnnotation] != want.Annotations[FallbackForAnnotation] ||
		svc.Spec.Type != *want.Spec.Type || !maps.Equal(svc.Spec.Selector, want.Spec.Selector) {
		return false
	}
	return slices.EqualFunc(svc.Spec.Ports, want.Spec.Ports, func(x corev1.ServicePort, y corev1ac.ServicePortApplyConfiguration) bool {
		return x.Name == *y.Name && x.Protocol == *y.Protocol && x.Port == *y.Port && x.TargetPort == *y.TargetPort
	})
}

// fallbackWriteError turns a forbidden write into the condition (retrying
// cannot grant RBAC; the next event on the route retries) and passes other
// errors on for the workqueue's backoff.
func (r *Reconciler) fallbackWriteError(route *v1alpha1.ModelRoute, key client.ObjectKey, verb string, err error) error {
	if apierrors.IsForbidden(err) {
		r.markFallbackConflict(route, ReasonServiceNotPermitted, fmt.Sprintf(
			"cannot %s fallback Service %s: %v; grant services create/patch/delete (Helm value failOpen.manageFallbackServices: true) or discover the backends by Service", verb, key, err))
		return nil
	}
	return fmt.Errorf("%s fallback service %s: %w", verb, key, err)
}

// cleanupFallbackService deletes the route's fallback Service if the route
// controls it (route deleted, or no longer FailOpen+selector); a foreign
// Service of that name is left alone. Called by the finalizer too.
func (r *Reconciler) cleanupFallbackService(ctx context.Context, route *v1alpha1.ModelRoute) error {
	key := client.ObjectKey{Namespace: route.Namespace, Name: FallbackServiceName(route.Name)}
	var svc corev1.Service
	if err := r.Client.Get(ctx, key, &svc); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(&svc, route) {
		return nil
	}
	err := r.Client.Delete(ctx, &svc, client.Preconditions{UID: &svc.UID})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone, or replaced by someone else's object
	}
	if apierrors.IsForbidden(err) {
		ctrl.LoggerFrom(ctx).Info("cannot delete fallback service: not permitted; delete it by hand", "service", key.String())
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete fallback service %s: %w", key, err)
	}
	ctrl.LoggerFrom(ctx).Info("deleted fallback service", "service", key.String())
	return nil
}

// markFallbackConflict sets the condition and emits a Warning event when
// the condition appears or changes reason (transitions, not every
// reconcile).
func (r *Reconciler) markFallbackConflict(route *v1alpha1.ModelRoute, reason, msg string) {
	before := meta.FindStatusCondition(route.Status.Conditions, TypeFallbackServiceConflict)
	setCondition(route, TypeFallbackServiceConflict, metav1.ConditionTrue, reason, msg)
	if r.Recorder != nil && (before == nil || before.Status != metav1.ConditionTrue || before.Reason != reason) {
		r.Recorder.Eventf(route, nil, corev1.EventTypeWarning, TypeFallbackServiceConflict, "FallbackService", "%s", msg)
	}
}

func (r *Reconciler) clearFallbackConflict(route *v1alpha1.ModelRoute) {
	meta.RemoveStatusCondition(&route.Status.Conditions, TypeFallbackServiceConflict)
}
