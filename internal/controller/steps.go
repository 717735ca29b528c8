package controller

// This file: the reconcile steps that lead to the outputs: validate the
// spec, discover the endpoints, compile.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/routespec"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// reconcileSpec validates and defaults the spec, once per generation.
// An invalid spec is terminal: only a new generation can fix it.
func (r *Reconciler) reconcileSpec(ctx context.Context, st *state) (bool, error) {
	spec, err := r.specs.validate(r.Validator, st.route)
	if err == nil {
		st.spec = spec
		return false, nil
	}
	var inv *schema.InvalidError
	if !errors.As(err, &inv) {
		return false, fmt.Errorf("validate spec: %w", err)
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

// reconcileDiscovery builds the endpoint snapshot. No backends stops here:
// the last good output stays in place (an empty list is never written).
func (r *Reconciler) reconcileDiscovery(ctx context.Context, st *state) (bool, error) {
	snap, err := r.discovery.Snapshot(ctx, st.spec)
	var pe *discovery.PortError
	if errors.As(err, &pe) {
		markStalled(st.route, ReasonPortNotDerivable, pe.Error())
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("discover: %w", err)
	}
	if snap.BackendService == nil {
		snap.BackendService = st.fallback
	}
	st.snap = snap
	st.route.Status.CartPeers = int32(len(snap.CartPods))
	if len(snap.Backends) == 0 {
		markWaiting(st.route, ReasonNoBackends, fmt.Sprintf(
			"no %s backends found for %s; keeping the last written output (%d endpoints)",
			readyWord(st.spec.Spec.Discovery), discoverySource(st.spec), st.route.Status.Backends))
		return true, nil
	}
	return false, nil
}

// reconcileCompile renders the outputs from the validated spec and the
// snapshot (pure Go; no CUE here).
func (r *Reconciler) reconcileCompile(ctx context.Context, st *state) (bool, error) {
	compile := r.Compile
	if compile == nil {
		compile = compiler.Compile
	}
	res, err := compile(compilerRoute(st.spec), st.snap, r.CompileOptions)
	if errors.Is(err, compiler.ErrNoBackends) {
		markWaiting(st.route, ReasonNoBackends, err.Error())
		return true, nil
	}
	if err != nil {
		// The inputs come from the spec and the cluster, both watched: a
		// change re-renders, a timer would not help.
		markStalled(st.route, ReasonCompileFailed, err.Error())
		return true, nil
	}
	st.result = res
	return false, nil
}

// compilerRoute is the compiler's view of a route.
func compilerRoute(route *v1alpha1.ModelRoute) *compiler.Route {
	return &compiler.Route{Name: route.Name, Namespace: route.Namespace, Spec: route.Spec}
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
