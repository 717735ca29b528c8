package controller

// This file: the reconcile steps that lead to the outputs: validate the
// spec, discover the endpoints, compile.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/routespec"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// reconcileSpec validates and defaults the spec, once per generation.
// An invalid spec is terminal: only a new generation can fix it.
func (r *Reconciler) reconcileSpec(ctx context.Context, st *state) (bool, error) {
	var spec *v1alpha1.ModelRoute
	var err error
	if r.preview {
		// Files previewed (-f) have no UID to key the cache by.
		spec, err = r.Validator.ValidateObject(st.route)
	} else {
		spec, err = r.Routes.specs.validate(r.Validator, st.route)
	}
	if err == nil {
		if c := spec.Spec.Canary; c != nil && routespec.SameBackends(spec.Spec.Discovery, c.Discovery, spec.Namespace) {
			// The schema compares the names as written; with the
			// namespace known, a bare name and ns/name can be one Service.
			markStalled(st.route, ReasonInvalidSpec, fmt.Sprintf(
				"spec.canary.discovery.service: it is the Service of spec.discovery (Service %s): both versions would be the same backends; point canary.discovery at the canary version's own Service (or, when the same pods serve both versions, give both discoveries their different ports)",
				routespec.RefKey(spec.Spec.Discovery.Service, spec.Namespace)))
			return true, reconcile.TerminalError(errors.New("invalid spec: canary on the stable Service"))
		}
		st.spec = spec
		return false, nil
	}
	var inv *schema.InvalidError
	if !errors.As(err, &inv) {
		// Validation does no I/O: the same spec fails the same way, so a
		// retry cannot help; only a new generation can.
		markStalled(st.route, ReasonInvalidSpec, "the spec cannot be validated: "+err.Error())
		return true, reconcile.TerminalError(fmt.Errorf("validate spec: %w", err))
	}
	msgs := make([]string, len(inv.Problems))
	for i, p := range inv.Problems {
		msgs[i] = p.Message
		if p.Path != "" {
			msgs[i] = p.Path + ": " + p.Message
		}
	}
	markStalled(st.route, ReasonInvalidSpec, strings.Join(msgs, "; "))
	return true, reconcile.TerminalError(fmt.Errorf("invalid spec: %w", err))
}

// checkNamespaces records every namespace the route references (its
// Services, its output ConfigMaps) that the controller does not watch
// (--namespace): the cache cannot read there. It returns the unwatched
// namespaces; nothing is rendered then.
func (r *Reconciler) checkNamespaces(_ context.Context, st *state) (bool, error) {
	if len(r.Namespaces) == 0 {
		return false, nil
	}
	refs := map[string][]string{}
	var order []string
	for _, ref := range append(discovery.RouteServices(st.route), discovery.RouteConfigMaps(st.route)...) {
		ns, _, _ := strings.Cut(ref, "/")
		if slices.Contains(r.Namespaces, ns) {
			continue
		}
		if _, seen := refs[ns]; !seen {
			order = append(order, ns)
		}
		refs[ns] = append(refs[ns], ref)
	}
	st.unwatched = map[string]bool{}
	for _, ns := range order {
		st.unwatched[ns] = true
		st.noRender = true
		st.block(ReasonNamespaceNotWatched, fmt.Sprintf(
			"namespace %s is not watched by this controller (--namespace %s), so %s cannot be read or written: add %s to --namespace (Helm value watchNamespaces)",
			ns, strings.Join(r.Namespaces, ","), strings.Join(refs[ns], ", "), ns), false)
	}
	return false, nil
}

// checkServiceGrants checks every Service the route references in another
// namespace (discovery, CART, nginx entry) against that Service's grant
// (sink.Granted: the allowed-route-namespaces annotation, or a trusted
// route namespace). An ungranted one blocks discovery altogether, so
// nothing of that namespace (endpoints, VIPs) is read into status or
// rendered, and status drops what it showed. Services that do not exist
// are left to discovery (ServiceNotFound).
func (r *Reconciler) checkServiceGrants(ctx context.Context, st *state) (bool, error) {
	if st.noRender {
		return false, nil
	}
	refs := []struct{ ref, field string }{{st.spec.Spec.Discovery.Service, "spec.discovery.service"}}
	if c := st.spec.Spec.Cart; c != nil {
		refs = append(refs, struct{ ref, field string }{c.Service, "spec.cart.service"})
	}
	refs = append(refs, struct{ ref, field string }{st.spec.Spec.Nginx.Service, "spec.nginx.service"})
	if c := st.spec.Spec.Canary; c != nil {
		refs = append(refs, struct{ ref, field string }{c.Discovery.Service, "spec.canary.discovery.service"})
	}
	ok := true
	for _, x := range refs {
		if x.ref == "" {
			continue
		}
		ns, name := routespec.SplitRef(x.ref, st.route.Namespace)
		if ns == st.route.Namespace || slices.Contains(r.TrustedNamespaces, st.route.Namespace) {
			continue
		}
		var svc corev1.Service
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &svc)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("get service %s/%s: %w", ns, name, err)
		}
		if sink.Granted(&svc, st.route.Namespace, r.TrustedNamespaces) {
			continue
		}
		ok = false
		st.block(ReasonNotPermitted, fmt.Sprintf(
			"Service %s/%s (%s) is in namespace %s, which has not granted namespace %s: nothing of it is read. Annotate the Service %s: %q (or \"*\"), or run the route in a namespace the controller trusts (--trusted-namespace, Helm value trustedNamespaces)",
			ns, name, x.field, ns, st.route.Namespace, sink.AllowedNamespacesAnnotation, st.route.Namespace), false)
	}
	if !ok {
		st.noRender = true
		st.route.Status.Backends = 0
		st.route.Status.CanaryBackends = 0
		st.route.Status.CartPeers = 0
	}
	return false, nil
}

// reconcileDiscovery builds the endpoint snapshot. A discovery Service that
// does not exist is reported as such. No backends keeps the last good
// output in place (an empty list is never written): nothing is rendered.
func (r *Reconciler) reconcileDiscovery(ctx context.Context, st *state) (bool, error) {
	if st.noRender {
		return false, nil
	}
	st.noRender = true // until backends are found
	if ref := st.spec.Spec.Discovery.Service; ref != "" {
		ns, name := routespec.SplitRef(ref, st.route.Namespace)
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &corev1.Service{})
		if apierrors.IsNotFound(err) {
			st.block(ReasonServiceNotFound, fmt.Sprintf(
				"Service %s/%s (spec.discovery.service) does not exist: create it or correct spec.discovery.service; keeping the last written output (%d endpoints)",
				ns, name, st.route.Status.Backends), false)
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("get service %s/%s: %w", ns, name, err)
		}
	}
	snap, err := r.discovery.Snapshot(ctx, st.spec)
	var pe *discovery.PortError
	if errors.As(err, &pe) {
		st.block(ReasonPortNotDerivable, pe.Error(), false)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discover: %w", err)
	}
	if snap.BackendService == nil {
		snap.BackendService = st.fallback
	}
	st.snap = snap
	st.route.Status.CartPeers = int32(len(snap.CartPods))
	if len(snap.Backends) == 0 && st.spec.Spec.ScaleToZero != nil {
		// Zero is a state of a scale-to-zero route: the compile renders a
		// route that holds requests (scaletozero.go wakes the target).
		st.noRender = false
		return false, nil
	}
	if len(snap.Backends) == 0 {
		st.block(ReasonNoBackends, fmt.Sprintf(
			"no %s backends found for %s; keeping the last written output (%d endpoints)",
			readyWord(st.spec.Spec.Discovery), discoverySource(st.spec), st.route.Status.Backends), true)
		return false, nil
	}
	st.noRender = false
	return false, nil
}

// compileInputs is what the compile needs from the cluster besides the
// snapshot, gathered by the read step (readCompileInputs) so the compile
// step itself reads nothing.
type compileInputs struct {
	// dynamicPeers: the route's nginx output ConfigMap declares that its
	// engine takes peers dynamically (peers.Annotation "true"), or the
	// controller renders so for every route (CompileOptions).
	dynamicPeers bool
	// skipNotes are what the cluster says about the Service a skipped
	// tier would have used, by the tier's use (cart, backend-svc): " (Service
	// ns/name does not exist)", " (Service ns/name is headless)".
	skipNotes map[string]string
}

// readCompileInputs reads what the compile needs besides the snapshot:
// the nginx output ConfigMap's dynamic-peers annotation (dynamicPeers) and,
// for a cart or backend-svc tier discovery found no Service VIP for, that
// Service (the detail of the tier the compile will skip). A failed read of
// the annotation leaves nothing to render (retried).
func (r *Reconciler) readCompileInputs(ctx context.Context, st *state) (bool, error) {
	st.inputs = compileInputs{dynamicPeers: r.CompileOptions.DynamicPeers}
	if st.noRender {
		return false, nil
	}
	if !st.inputs.dynamicPeers {
		dyn, err := dynamicPeers(ctx, r.Client, st.spec)
		if err != nil {
			st.noRender = true
			st.block(ReasonRetrying, err.Error(), true)
			return false, nil
		}
		st.inputs.dynamicPeers = dyn
	}
	for _, t := range []struct {
		use string
		ref string
		vip *compiler.ServiceVIP
	}{
		{routespec.UseCart, cartServiceRef(st.spec), st.snap.CartService},
		{routespec.UseBackendSvc, st.spec.Spec.Discovery.Service, st.snap.BackendService},
	} {
		if t.ref == "" || (t.vip != nil && t.vip.IP != "" && t.vip.IP != corev1.ClusterIPNone) ||
			!slices.ContainsFunc(st.spec.Spec.Nginx.Peers, func(p routespec.Peer) bool { return p.Use == t.use }) {
			// A tier with a VIP renders (or is skipped for a reason
			// that is not its Service's).
			continue
		}
		if note := serviceNote(ctx, r.Client, t.ref, st.route.Namespace); note != "" {
			if st.inputs.skipNotes == nil {
				st.inputs.skipNotes = map[string]string{}
			}
			st.inputs.skipNotes[t.use] = note
		}
	}
	return false, nil
}

// cartServiceRef is the Service of spec.cart ("" without spec.cart).
func cartServiceRef(route *v1alpha1.ModelRoute) string {
	if c := route.Spec.Cart; c != nil {
		return c.Service
	}
	return ""
}

// reconcileCompile renders the outputs from the validated spec, the
// snapshot and the compile inputs (pure Go; no CUE, no reads here). A
// failure leaves nothing to write. With nothing to render, the result
// holds the route's keys alone (for the outputs step's check).
func (r *Reconciler) reconcileCompile(_ context.Context, st *state) (bool, error) {
	route := compilerRoute(st.spec)
	if !st.noRender {
		st.noRender = !r.compile(st, route)
	}
	if st.noRender {
		st.result = compiler.Result{Keys: compiler.KeysFor(route, false)}
	}
	return false, nil
}

// compile runs the compile and records its problems; ok: st.result holds
// the render.
func (r *Reconciler) compile(st *state, route *compiler.Route) (ok bool) {
	compile := r.Compile
	if compile == nil {
		compile = compiler.Compile
	}
	opts := r.CompileOptions
	opts.DynamicPeers = st.inputs.dynamicPeers
	res, err := compile(route, st.snap, opts)
	if errors.Is(err, compiler.ErrNoBackends) {
		st.block(ReasonNoBackends, err.Error(), true)
		return false
	}
	if err != nil {
		// The inputs come from the spec and the cluster, both watched: a
		// change re-renders, a timer would not help.
		st.block(ReasonCompileFailed, err.Error(), false)
		return false
	}
	st.result = res
	skipped := make([]string, len(res.Skipped))
	for i, sk := range res.Skipped {
		skipped[i] = sk.String() + st.inputs.skipNotes[sk.Use]
	}
	markDegraded(st.route, skipped, canaryDegraded(st))
	return true
}

// dynamicPeers reports whether the route's nginx output ConfigMap declares
// that its engine takes peers dynamically (peers.Annotation "true"): then
// the route file leaves the peers to the peers table key. A ConfigMap
// that does not exist declares nothing (the write reports it missing).
func dynamicPeers(ctx context.Context, c client.Reader, route *v1alpha1.ModelRoute) (bool, error) {
	ref := route.Spec.Nginx.OutputConfigMap
	if ref == "" {
		return false, nil
	}
	ns, name := routespec.SplitRef(ref, route.Namespace)
	meta := &metav1.PartialObjectMetadata{}
	meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, meta); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("read ConfigMap %s/%s for its %s annotation: %w", ns, name, peers.Annotation, err)
	}
	return meta.GetAnnotations()[peers.Annotation] == "true", nil
}

// serviceNote says what the cluster says about a Service a tier would use
// when it does not exist or is headless ("" otherwise, or when it cannot
// be read).
func serviceNote(ctx context.Context, c client.Reader, ref, routeNS string) string {
	ns, name := routespec.SplitRef(ref, routeNS)
	var svc corev1.Service
	switch err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &svc); {
	case apierrors.IsNotFound(err):
		return fmt.Sprintf(" (Service %s/%s does not exist)", ns, name)
	case err == nil && svc.Spec.ClusterIP == corev1.ClusterIPNone:
		return fmt.Sprintf(" (Service %s/%s is headless)", ns, name)
	}
	return ""
}

// compilerRoute is the compiler's view of a route.
func compilerRoute(route *v1alpha1.ModelRoute) *compiler.Route {
	return &compiler.Route{Name: route.Name, Namespace: route.Namespace, Spec: route.Spec}
}

// canaryDegraded says why the route's canary serves nothing ("" when the
// compile found canary backends or the route has no canary: the
// compiler's Result.CanaryNoBackends): every request then falls through
// to the stable version.
func canaryDegraded(st *state) string {
	c := st.spec.Spec.Canary
	if c == nil || !st.result.CanaryNoBackends {
		return ""
	}
	src := fmt.Sprintf("pods %q in %s", c.Discovery.Selector, st.route.Namespace)
	if c.Discovery.Service != "" {
		src = "Service " + routespec.RefKey(c.Discovery.Service, st.route.Namespace)
	}
	return fmt.Sprintf("spec.canary: no %s canary backends found for %s: every request is served by the stable version (weight %d%% falls through) until the canary has endpoints",
		readyWord(c.Discovery), src, c.Weight)
}

func readyWord(d v1alpha1.Discovery) string {
	if d.IncludeNotReady {
		return "usable"
	}
	return "ready"
}

func discoverySource(route *v1alpha1.ModelRoute) string {
	d := route.Spec.Discovery
	if d.Service != "" {
		return "Service " + routespec.RefKey(d.Service, route.Namespace)
	}
	return fmt.Sprintf("pods %q in %s", d.Selector, route.Namespace)
}
