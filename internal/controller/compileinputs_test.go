package controller

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// readsClient serves Gets of Services and ConfigMap metadata from its maps
// and records them; any other call panics (the read step only gets).
type readsClient struct {
	client.Client
	services   map[string]*corev1.Service
	configMaps map[string]map[string]string // ns/name → annotations
	gets       []string
}

func (c *readsClient) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	switch o := obj.(type) {
	case *corev1.Service:
		c.gets = append(c.gets, "Service "+key.String())
		svc, ok := c.services[key.String()]
		if !ok {
			return apierrors.NewNotFound(schema.GroupResource{Resource: "services"}, key.Name)
		}
		svc.DeepCopyInto(o)
	case *metav1.PartialObjectMetadata:
		c.gets = append(c.gets, "ConfigMap "+key.String())
		ann, ok := c.configMaps[key.String()]
		if !ok {
			return apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, key.Name)
		}
		o.SetAnnotations(ann)
	default:
		panic("unexpected get")
	}
	return nil
}

// TestReadCompileInputs: the read step gathers the dynamic-peers
// annotation and the Services of the tiers discovery found no VIP for,
// and reads no Service of a tier that has one; the compile step then
// reads nothing.
func TestReadCompileInputs(t *testing.T) {
	route := &v1alpha1.ModelRoute{ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: "ns"}}
	route.Spec.Discovery.Service = "backend"
	route.Spec.Cart = &v1alpha1.Cart{OutputConfigMap: "cart"}
	route.Spec.Cart.Service = "cart"
	route.Spec.Nginx.OutputConfigMap = "routes"
	route.Spec.Nginx.Peers = []v1alpha1.Peer{{Use: v1alpha1.UseCart}, {Use: v1alpha1.UseBackendSvc}}

	c := &readsClient{
		services:   map[string]*corev1.Service{"ns/backend": {Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone}}},
		configMaps: map[string]map[string]string{"ns/routes": {peers.Annotation: "true"}},
	}
	r := &Reconciler{Client: c}
	st := &state{route: route, spec: route}
	if _, err := r.readCompileInputs(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if !st.inputs.dynamicPeers {
		t.Error("dynamicPeers not read from the routes ConfigMap's annotation")
	}
	want := map[string]string{
		v1alpha1.UseCart:       " (Service ns/cart does not exist)",
		v1alpha1.UseBackendSvc: " (Service ns/backend is headless)",
	}
	for use, note := range want {
		if st.inputs.skipNotes[use] != note {
			t.Errorf("skip note of %s = %q, want %q", use, st.inputs.skipNotes[use], note)
		}
	}

	// With a VIP for both tiers, no Service is read.
	c.gets = nil
	st = &state{route: route, spec: route, snap: compiler.Snapshot{
		CartService:    &compiler.ServiceVIP{IP: "10.0.0.1", Port: 80},
		BackendService: &compiler.ServiceVIP{IP: "10.0.0.2", Port: 80},
	}}
	if _, err := r.readCompileInputs(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if len(c.gets) != 1 || len(st.inputs.skipNotes) != 0 {
		t.Errorf("gets %q, notes %v; want only the routes ConfigMap", c.gets, st.inputs.skipNotes)
	}

	// The compile step reads nothing.
	c.gets = nil
	st.noRender = false
	if _, err := r.reconcileCompile(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if len(c.gets) != 0 {
		t.Errorf("the compile step read %q", c.gets)
	}
}
