package controller

// This file: the fallback Service step: what a FailOpen selector route
// wants (name, selector) and the reconcile step that gets it there.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

// fallbackService is the fallback Service of the FailOpen selector routes:
// the fallback step (reconcileFallback) reconciles or previews it, the
// finalizer cleans it up.
type fallbackService struct {
	// client reads through the cache and writes (server-side apply).
	client client.Client
	// apiReader reads around the cache (nil: client).
	apiReader client.Reader
	// recorder emits the conflict's events (nil: none).
	recorder events.EventRecorder
	// pods reads the selected pods (the port).
	pods podReaderFunc
}

// reconcileFallback is the reconcile step around fallbackService.reconcile;
// it runs before discovery so a switch away from FailOpen cleans up even
// while the route has no backends.
func (r *Reconciler) reconcileFallback(ctx context.Context, st *state) (bool, error) {
	if r.preview {
		vip, err := r.fallback.preview(ctx, st)
		st.fallback = vip
		return false, err
	}
	vip, err := r.fallback.reconcile(ctx, st.route, st.spec)
	st.fallback = vip
	return false, err
}

// reconcile makes the route's fallback Service match its
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
func (f *fallbackService) reconcile(ctx context.Context, route, spec *v1alpha1.ModelRoute) (*compiler.ServiceVIP, error) {
	log := ctrl.LoggerFrom(ctx)
	key := client.ObjectKey{Namespace: route.Namespace, Name: FallbackServiceName(route.Name)}
	if !wantsFallback(spec) {
		clearFallbackConflict(route)
		return nil, f.cleanup(ctx, route)
	}
	selector, err := fallbackSelector(spec.Spec.Discovery.Selector)
	if err != nil {
		f.markConflict(route, ReasonSelectorNotExpressible, fmt.Sprintf(
			"no fallback Service for FailOpen: %v; the route renders no static Service VIP tier", err))
		return nil, nil
	}
	port, err := f.port(ctx, spec)
	if err != nil {
		return nil, err
	}

	var svc corev1.Service
	err = f.client.Get(ctx, key, &svc)
	if apierrors.IsNotFound(err) && f.apiReader != nil {
		// The cache may lag a Service just created by someone else: ask
		// the API server before an apply that would create ours.
		err = f.apiReader.Get(ctx, key, &svc)
	}
	var uid types.UID // apply precondition: the Service this route controls
	switch {
	case apierrors.IsNotFound(err):
		if port == 0 {
			// No pod yet (or ports ambiguous, which discovery reports):
			// pods are watched, so their arrival brings us back.
			clearFallbackConflict(route)
			return nil, nil
		}
	case err != nil:
		return nil, fmt.Errorf("get fallback service %s: %w", key, err)
	case !metav1.IsControlledBy(&svc, route):
		f.markConflict(route, ReasonServiceNotOwned, fmt.Sprintf(
			"Service %s exists and is not controlled by this route; autoconfig never modifies it, so the FailOpen route renders no static Service VIP tier. Delete or rename that Service to let autoconfig create its own", key))
		return nil, nil
	default:
		if port == 0 && len(svc.Spec.Ports) > 0 {
			port = svc.Spec.Ports[0].TargetPort.IntVal // keep the last known port
		}
		uid = svc.UID
	}
	want, err := f.applyConfig(key, route, selector, port, uid)
	if err != nil {
		return nil, err
	}
	if uid == "" || !appliedFallback(&svc, want) {
		verb := "update"
		if uid == "" {
			verb = "create"
		} else if err := f.upgradeFields(ctx, key); err != nil {
			return nil, f.writeError(route, key, verb, err)
		}
		applied, err := f.apply(ctx, want)
		if err != nil {
			return nil, f.writeError(route, key, verb, err)
		}
		log.Info(verb+"d fallback service", "service", key.String(), "port", port, "selector", selector)
		svc = *applied
	}
	clearFallbackConflict(route)
	return discovery.ServiceVIP(&svc, port, FallbackPortName), nil
}
