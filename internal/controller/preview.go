package controller

// This file: Preview, what a reconcile would write for a route, computed
// from the live cluster by the reconcile's own steps without writing
// anything (autoconfig diff, autoconfig compile --from-cluster).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// Preview is what the controller would do with one route now.
type Preview struct {
	// Route is "namespace/name".
	Route string
	// Outputs are the keys the route renders, then the keys it holds
	// (status.outputs) and would remove, in the order the controller
	// handles them.
	Outputs []PreviewOutput
	// Problems keep the route from Ready ("Reason: message"), as its
	// Ready condition would say. With any of them but a blocked key the
	// controller writes nothing and Outputs is empty.
	Problems []string
	// Warnings are the compiler's (e.g. a skipped peer tier) and the
	// preview's own (what it cannot know before the controller acts).
	Warnings []string
}

// PreviewOutput is one ConfigMap key: what it holds now and what the
// controller would leave in it.
type PreviewOutput struct {
	// ConfigMap is "namespace/name".
	ConfigMap, Key string
	// Live is the key's content now; LiveExists is false when the key
	// (or the ConfigMap) does not exist.
	Live       []byte
	LiveExists bool
	// Rendered is the content the controller would write; nil with
	// Removed or Err.
	Rendered []byte
	// Removed: the route holds the key and no longer renders it; the
	// controller removes it.
	Removed bool
	// Err: the output cannot be rendered against the live content (e.g.
	// the CART base config is missing); the controller would not write it.
	Err error
}

// Changed reports whether the controller would change the key.
func (o PreviewOutput) Changed() bool {
	switch {
	case o.Err != nil:
		return false
	case o.Removed:
		return o.LiveExists
	}
	return !o.LiveExists || string(o.Live) != string(o.Rendered)
}

// NewPreviewer returns a Reconciler that only previews: it reads the
// cluster through c (a live client) with the controller's field indexes
// evaluated client-side (discovery.IndexedReader), and every write it
// could attempt fails. trusted are the controller's --trusted-namespace
// values (grants are checked as the controller checks them).
func NewPreviewer(c client.Client, v Validator, opts compiler.Options, trusted []string) *Reconciler {
	ro := readOnlyClient{Client: c, reader: discovery.IndexedReader(c, c.Scheme())}
	r := &Reconciler{Client: ro, APIReader: ro, Validator: v, CompileOptions: opts, TrustedNamespaces: trusted}
	r.discovery = &discovery.Reader{Client: ro}
	return r
}

// Preview runs the reconcile's steps up to the write (validate, fallback
// Service, grants, discovery, compile, the monitor guard) for route and
// reads the live content of every key it would touch. route is not
// modified. An invalid spec is an error (schema.InvalidError).
func (r *Reconciler) Preview(ctx context.Context, route *v1alpha1.ModelRoute) (*Preview, error) {
	st := &state{route: route.DeepCopy(), started: time.Now()}
	p := &Preview{Route: route.Namespace + "/" + route.Name}
	spec, err := r.Validator.ValidateObject(st.route)
	if err != nil {
		return nil, err
	}
	st.spec = spec
	if st.fallback, err = r.previewFallback(ctx, st, p); err != nil {
		return nil, err
	}
	compiled := false
	granted, err := r.checkServiceGrants(ctx, st)
	if err != nil {
		return nil, err
	}
	if granted {
		found, err := r.reconcileDiscovery(ctx, st)
		if err != nil {
			return nil, err
		}
		compiled = found && r.reconcileCompile(ctx, st)
	}
	if compiled {
		p.Warnings = append(p.Warnings, st.result.Warnings...)
		outs := r.dropUnsafeMonitor(ctx, st, st.result.Outputs)
		now := map[string][]string{}
		for _, o := range outs {
			now[o.ConfigMap] = append(now[o.ConfigMap], o.Key)
			po := PreviewOutput{ConfigMap: o.ConfigMap, Key: o.Key}
			var current []byte
			if current, po.LiveExists, err = r.liveKey(ctx, o.ConfigMap, o.Key); err != nil {
				return nil, err
			}
			if po.LiveExists {
				po.Live = current
			}
			if po.Rendered, po.Err = o.Render(current); po.Err != nil {
				po.Rendered = nil
			}
			p.Outputs = append(p.Outputs, po)
		}
		for _, cm := range sortedKeys(ownedFromStatus(route.Status.Outputs)) {
			for _, k := range ownedFromStatus(route.Status.Outputs)[cm] {
				if slices.Contains(now[cm], k) {
					continue
				}
				po := PreviewOutput{ConfigMap: cm, Key: k, Removed: true}
				if po.Live, po.LiveExists, err = r.liveKey(ctx, cm, k); err != nil {
					return nil, err
				}
				p.Outputs = append(p.Outputs, po)
			}
		}
	}
	for _, pr := range st.problems {
		p.Problems = append(p.Problems, pr.reason+": "+pr.msg)
	}
	return p, nil
}

// liveKey reads one key of a ConfigMap ("ns/name") from the API server.
func (r *Reconciler) liveKey(ctx context.Context, cm, key string) ([]byte, bool, error) {
	ns, name, _ := strings.Cut(cm, "/")
	var obj corev1.ConfigMap
	switch err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &obj); {
	case apierrors.IsNotFound(err):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("get configmap %s: %w", cm, err)
	}
	v, ok := obj.Data[key]
	return []byte(v), ok, nil
}

// previewFallback is reconcileFallbackService without the apply: the VIP
// of the route's fallback Service when it exists and the route controls
// it. A Service the controller would still create has no VIP yet: the
// preview renders without that tier and says so.
func (r *Reconciler) previewFallback(ctx context.Context, st *state, p *Preview) (*compiler.ServiceVIP, error) {
	if !wantsFallback(st.spec) {
		return nil, nil
	}
	if _, err := fallbackSelector(st.spec.Spec.Discovery.Selector); err != nil {
		p.Warnings = append(p.Warnings, fmt.Sprintf("no fallback Service for FailOpen: %v", err))
		return nil, nil
	}
	port, err := r.fallbackPort(ctx, st.spec)
	if err != nil {
		return nil, err
	}
	key := client.ObjectKey{Namespace: st.route.Namespace, Name: FallbackServiceName(st.route.Name)}
	var svc corev1.Service
	err = r.Client.Get(ctx, key, &svc)
	switch {
	case apierrors.IsNotFound(err):
		if port != 0 {
			p.Warnings = append(p.Warnings, fmt.Sprintf(
				"the controller would create the fallback Service %s; its ClusterIP is not known before that, so this preview renders without the backend-svc tier", key))
		}
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("get fallback service %s: %w", key, err)
	case !metav1.IsControlledBy(&svc, st.route):
		p.Warnings = append(p.Warnings, fmt.Sprintf(
			"Service %s exists and is not controlled by this route: no static Service VIP tier (condition %s)", key, ReasonServiceNotOwned))
		return nil, nil
	}
	if port == 0 && len(svc.Spec.Ports) > 0 {
		port = svc.Spec.Ports[0].TargetPort.IntVal
	}
	return discovery.ServiceVIP(&svc, port, FallbackPortName), nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// errReadOnly is what every write of a previewing Reconciler returns.
var errReadOnly = errors.New("autoconfig preview: read-only, nothing is written")

// readOnlyClient reads through reader (the indexed live reader) and fails
// every write, so a preview cannot change the cluster whatever step it
// runs.
type readOnlyClient struct {
	client.Client
	reader client.Reader
}

func (c readOnlyClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return c.reader.Get(ctx, key, obj, opts...)
}

func (c readOnlyClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return c.reader.List(ctx, list, opts...)
}

func (readOnlyClient) Create(context.Context, client.Object, ...client.CreateOption) error {
	return errReadOnly
}

func (readOnlyClient) Update(context.Context, client.Object, ...client.UpdateOption) error {
	return errReadOnly
}

func (readOnlyClient) Patch(context.Context, client.Object, client.Patch, ...client.PatchOption) error {
	return errReadOnly
}

func (readOnlyClient) Apply(context.Context, runtime.ApplyConfiguration, ...client.ApplyOption) error {
	return errReadOnly
}

func (readOnlyClient) Delete(context.Context, client.Object, ...client.DeleteOption) error {
	return errReadOnly
}

func (readOnlyClient) DeleteAllOf(context.Context, client.Object, ...client.DeleteAllOfOption) error {
	return errReadOnly
}

func (c readOnlyClient) Status() client.SubResourceWriter { return c.SubResource("status") }

func (c readOnlyClient) SubResource(string) client.SubResourceClient {
	return readOnlySubResource{}
}

type readOnlySubResource struct{}

func (readOnlySubResource) Get(context.Context, client.Object, client.Object, ...client.SubResourceGetOption) error {
	return errReadOnly
}

func (readOnlySubResource) Create(context.Context, client.Object, client.Object, ...client.SubResourceCreateOption) error {
	return errReadOnly
}

func (readOnlySubResource) Update(context.Context, client.Object, ...client.SubResourceUpdateOption) error {
	return errReadOnly
}

func (readOnlySubResource) Patch(context.Context, client.Object, client.Patch, ...client.SubResourcePatchOption) error {
	return errReadOnly
}

func (readOnlySubResource) Apply(context.Context, runtime.ApplyConfiguration, ...client.SubResourceApplyOption) error {
	return errReadOnly
}
