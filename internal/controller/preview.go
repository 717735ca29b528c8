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
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// Preview is what the controller would do with one route now: the same
// reconcile steps (Reconciler.steps) run with the dry-run writer.
type Preview struct {
	// Route is "namespace/name".
	Route string
	// Outputs are the keys the route renders, then the keys it holds
	// (status.outputs) and would remove, in the order the controller
	// handles them; each says what the controller would do with it.
	Outputs []PreviewOutput
	// Ready is the Ready condition the controller would set.
	Ready metav1.Condition
	// Problems keep the route from Ready ("Reason: message"), as its
	// Ready condition would list them.
	Problems []string
	// Warnings are the compiler's (e.g. a skipped peer tier) and the
	// preview's own (what it cannot know before the controller acts).
	Warnings []string
}

// Refusal is why the controller would not write a key: the reason and
// message of the problem it would report in the route's Ready condition.
type Refusal struct {
	Reason, Message string
}

func (r Refusal) String() string { return r.Reason + ": " + r.Message }

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
	// Removed or Refused.
	Rendered []byte
	// Removed: the route holds the key and no longer renders it; the
	// controller removes it.
	Removed bool
	// Refused: the controller would not write the key (nor remove it),
	// for these reasons (as in the route's Ready condition).
	Refused []Refusal
}

// Changed reports whether the controller would change the key.
func (o PreviewOutput) Changed() bool {
	switch {
	case len(o.Refused) > 0:
		return false
	case o.Removed:
		return o.LiveExists
	}
	return !o.LiveExists || string(o.Live) != string(o.Rendered)
}

// NewPreviewer returns a Reconciler that only previews: it reads the
// cluster through c (a live client) with the controller's field indexes
// evaluated client-side (discovery.IndexedReader), writes through the
// dry-run writer (which reads the live ConfigMaps and runs the writer's
// guards), and every other write it could attempt fails. namespaces and
// trusted are the controller's --namespace and --trusted-namespace values
// (the namespace scope and grants are checked as the controller checks
// them).
func NewPreviewer(c client.Client, v Validator, opts compiler.Options, namespaces, trusted []string) *Reconciler {
	ro := readOnlyClient{Client: c, reader: discovery.IndexedReader(c, c.Scheme())}
	r := &Reconciler{Client: ro, APIReader: ro, Validator: v, CompileOptions: opts,
		Namespaces: namespaces, TrustedNamespaces: trusted, Routes: NewRouteState(), preview: true}
	r.discovery = &discovery.Reader{Client: ro}
	r.fallback = &fallbackService{client: ro, apiReader: ro, pods: podReader(nil, ro)}
	r.out = &sink.DryRun{Reader: ro, Trusted: trusted}
	return r
}

// Preview runs the reconcile's steps (validate, fallback Service,
// namespace scope, grants, discovery, compile, the outputs with their
// guards) for route with the dry-run writer and says, per key, what the
// controller would write or why it would not. route is not modified. An
// invalid spec is an error (schema.InvalidError).
func (r *Reconciler) Preview(ctx context.Context, route *v1alpha1.ModelRoute) (*Preview, error) {
	st := &state{route: route.DeepCopy(), started: time.Now()}
	if err := r.runSteps(ctx, st); err != nil {
		var inv *schema.InvalidError
		if errors.As(err, &inv) {
			return nil, inv
		}
		return nil, err
	}
	p := &Preview{Route: route.Namespace + "/" + route.Name, Warnings: slices.Clone(st.previewWarnings)}
	p.Warnings = append(p.Warnings, st.result.Warnings...)
	if c := meta.FindStatusCondition(st.route.Status.Conditions, TypeReady); c != nil {
		p.Ready = *c
	}
	for _, pr := range sortedProblems(st.problems) {
		p.Problems = append(p.Problems, pr.reason+": "+pr.msg)
	}
	refusals := func(cm, key string) []Refusal {
		var out []Refusal
		for _, pr := range sortedProblems(st.problems) {
			if (len(pr.scope) == 0 && st.noRender) || slices.Contains(pr.scope, cm) || slices.Contains(pr.scope, cm+"|"+key) {
				out = append(out, Refusal{Reason: pr.reason, Message: pr.msg})
			}
		}
		return out
	}
	seen := map[string]bool{}
	add := func(po PreviewOutput) {
		seen[po.ConfigMap+"|"+po.Key] = true
		p.Outputs = append(p.Outputs, po)
	}
	rendered := map[string]compiler.Output{}
	for _, o := range st.result.Outputs {
		rendered[o.ConfigMap+"|"+o.Key] = o
	}
	for _, o := range st.written {
		for _, k := range o.Keys {
			po := PreviewOutput{ConfigMap: o.ConfigMap, Key: k, Refused: refusals(o.ConfigMap, k)}
			var err error
			if po.Live, po.LiveExists, err = r.liveKey(ctx, o.ConfigMap, k); err != nil {
				return nil, err
			}
			if out, ok := rendered[o.ConfigMap+"|"+k]; ok && len(po.Refused) == 0 {
				if po.Rendered, err = out.Render(liveInput(po)); err != nil {
					po.Refused = []Refusal{{Reason: ReasonRenderFailed, Message: err.Error()}}
					po.Rendered = nil
				}
			}
			add(po)
		}
	}
	// Keys held back before the writer saw them (the monitor file in an
	// nginx ConfigMap).
	for _, pr := range st.problems {
		for _, sc := range pr.scope {
			cm, key, ok := strings.Cut(sc, "|")
			if !ok || seen[sc] {
				continue
			}
			po := PreviewOutput{ConfigMap: cm, Key: key, Refused: refusals(cm, key)}
			var err error
			if po.Live, po.LiveExists, err = r.liveKey(ctx, cm, key); err != nil {
				return nil, err
			}
			add(po)
		}
	}
	for _, o := range st.removed {
		for _, k := range o.Keys {
			if seen[o.ConfigMap+"|"+k] {
				continue
			}
			po := PreviewOutput{ConfigMap: o.ConfigMap, Key: k, Removed: true}
			var err error
			if po.Live, po.LiveExists, err = r.liveKey(ctx, o.ConfigMap, k); err != nil {
				return nil, err
			}
			for _, b := range o.Blocked {
				if b.Key == k {
					po.Removed = false
					p.Warnings = append(p.Warnings, fmt.Sprintf("%s/%s: the route no longer renders this key and the controller would leave it: %v", o.ConfigMap, k, b.Err))
				}
			}
			if po.Removed {
				add(po)
			}
		}
	}
	return p, nil
}

// liveInput is the content a render starts from: the live value, nil when
// the key is absent.
func liveInput(po PreviewOutput) []byte {
	if !po.LiveExists {
		return nil
	}
	return po.Live
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

// preview is reconcile without the apply: the VIP
// of the route's fallback Service when it exists and the route controls
// it. A Service the controller would still create has no VIP yet: the
// preview renders without that tier and says so.
func (f *fallbackService) preview(ctx context.Context, st *state) (*compiler.ServiceVIP, error) {
	if !wantsFallback(st.spec) {
		return nil, nil
	}
	if _, err := fallbackSelector(st.spec.Spec.Discovery.Selector); err != nil {
		st.previewWarnings = append(st.previewWarnings, fmt.Sprintf("no fallback Service for FailOpen: %v", err))
		return nil, nil
	}
	port, err := f.port(ctx, st.spec)
	if err != nil {
		return nil, err
	}
	key := client.ObjectKey{Namespace: st.route.Namespace, Name: FallbackServiceName(st.route.Name)}
	var svc corev1.Service
	err = f.client.Get(ctx, key, &svc)
	switch {
	case apierrors.IsNotFound(err):
		if port != 0 {
			st.previewWarnings = append(st.previewWarnings, fmt.Sprintf(
				"the controller would create the fallback Service %s; its ClusterIP is not known before that, so this preview renders without the backend-svc tier", key))
		}
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("get fallback service %s: %w", key, err)
	case !metav1.IsControlledBy(&svc, st.route):
		st.previewWarnings = append(st.previewWarnings, fmt.Sprintf(
			"Service %s exists and is not controlled by this route: no static Service VIP tier (condition %s)", key, ReasonServiceNotOwned))
		return nil, nil
	}
	if port == 0 && len(svc.Spec.Ports) > 0 {
		port = svc.Spec.Ports[0].TargetPort.IntVal
	}
	return discovery.ServiceVIP(&svc, port, FallbackPortName), nil
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
