package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/internal/testenv"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TestRoundTripThroughAPIServer stores the LLM sample with a typed client
// (scheme registration + deep copies), writes status through the status
// subresource, lists it, and reads the printer columns kubectl shows.
func TestRoundTripThroughAPIServer(t *testing.T) {
	_, cfg := testenv.Start(t)
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(root, "deploy", "samples", "modelroute-llm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var mr v1alpha1.ModelRoute
	if err := yaml.UnmarshalStrict(src, &mr); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: mr.Namespace}}); err != nil {
		t.Fatal(err)
	}
	want := mr.Spec.DeepCopy()
	// The CRD's defaults, which the API server fills: the constant ones
	// of the CUE schema (modelType, cart.maxLoad, includeNotReady).
	if want.ModelType == "" {
		want.ModelType = "llm"
	}
	if want.Cart != nil && want.Cart.MaxLoad == 0 {
		want.Cart.MaxLoad = 20
	}
	if err := c.Create(ctx, &mr); err != nil {
		t.Fatalf("create sample: %v", err)
	}

	var got v1alpha1.ModelRoute
	if err := c.Get(ctx, client.ObjectKeyFromObject(&mr), &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&got.Spec, want) {
		t.Errorf("stored spec differs:\n got %+v\nwant %+v", got.Spec, *want)
	}

	// Status goes through the subresource; a spec write does not touch it.
	got.Status = v1alpha1.Status{
		ObservedGeneration: got.Generation,
		Backends:           3,
		CartPeers:          2,
		Conditions: []metav1.Condition{{
			Type: "Ready", Status: metav1.ConditionTrue, Reason: "Written",
			Message: "outputs written", LastTransitionTime: metav1.Now(), ObservedGeneration: got.Generation,
		}, {
			Type: "Degraded", Status: metav1.ConditionTrue, Reason: "TierSkipped",
			Message: "spec.nginx.peers[0] (use: cart) skipped", LastTransitionTime: metav1.Now(), ObservedGeneration: got.Generation,
		}},
		Outputs:   []v1alpha1.OutputKeys{{ConfigMap: "gw/routes", Keys: []string{"session_route_a.conf"}}},
		Consumers: []v1alpha1.Consumer{{Pod: "gw/openresty-0", Key: "session_route_a.conf", State: v1alpha1.ConsumerSynced, Served: "0123456789abcdef", Since: &metav1.Time{Time: metav1.Now().Rfc3339Copy().Time}}},
		Synced:    "1/1",
	}
	wantStatus := got.Status.DeepCopy()
	if err := c.Status().Update(ctx, &got); err != nil {
		t.Fatalf("status update: %v", err)
	}

	// A canary route: the API server fills the split keys' defaults when
	// split is given; status counts each version's backends.
	canary := &v1alpha1.ModelRoute{ObjectMeta: metav1.ObjectMeta{Name: "qwen-canary", Namespace: mr.Namespace}, Spec: *mr.Spec.DeepCopy()}
	canary.Spec.Nginx.Route = "qwen-canary"
	canary.Spec.Monitor = nil
	canary.Spec.Canary = &v1alpha1.Canary{Discovery: v1alpha1.Discovery{Service: "llm/qwen-v2"}, Weight: 15}
	canary.Spec.Split = &v1alpha1.Split{StickyHeader: "x-conversation"}
	canary.Spec.ScaleToZero = &v1alpha1.ScaleToZero{Target: v1alpha1.ScaleTarget{Kind: "Deployment", Name: "qwen-v2"}}
	if err := c.Create(ctx, canary); err != nil {
		t.Fatalf("create canary route: %v", err)
	}
	if got, want := *canary.Spec.Split, (v1alpha1.Split{StickyHeader: "x-conversation", OverrideHeader: "x-model-version", StickyCookie: "autoconfig-session"}); got != want {
		t.Errorf("stored split %+v, want the defaults filled: %+v", got, want)
	}
	if got, want := *canary.Spec.ScaleToZero, (v1alpha1.ScaleToZero{Target: v1alpha1.ScaleTarget{Kind: "Deployment", Name: "qwen-v2"}, WakeReplicas: 1, HoldTimeout: "300s"}); got != want {
		t.Errorf("stored scaleToZero %+v, want the defaults filled: %+v", got, want)
	}
	canary.Status = v1alpha1.Status{ObservedGeneration: canary.Generation, Backends: 4, CanaryBackends: 1}
	if err := c.Status().Update(ctx, canary); err != nil {
		t.Fatalf("canary status update: %v", err)
	}

	var list v1alpha1.ModelRouteList
	if err := c.List(ctx, &list, client.InNamespace(mr.Namespace)); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 2 {
		t.Fatalf("list: %d items, want 2", len(list.Items))
	}
	if gs := list.Items[1].Status; list.Items[1].Name != "qwen-canary" || gs.Backends != 4 || gs.CanaryBackends != 1 {
		t.Errorf("stored canary status differs: %s %+v", list.Items[1].Name, gs)
	}
	gs := list.Items[0].Status
	if gs.Backends != wantStatus.Backends || gs.CartPeers != wantStatus.CartPeers ||
		!reflect.DeepEqual(gs.Outputs, wantStatus.Outputs) || gs.Synced != "1/1" ||
		len(gs.Consumers) != 1 || gs.Consumers[0].Served != "0123456789abcdef" || !gs.Consumers[0].Since.Equal(wantStatus.Consumers[0].Since) ||
		len(gs.Conditions) != 2 || gs.Conditions[0].Type != "Ready" || gs.Conditions[0].Status != metav1.ConditionTrue {
		t.Errorf("stored status differs: %+v", gs)
	}

	// kubectl get mr: NAME BACKENDS CART CANARY WAKE READY SYNCED DEGRADED AGE.
	table := getTable(ctx, t, cfg, "/apis/"+v1alpha1.Group+"/"+v1alpha1.Version+"/namespaces/"+mr.Namespace+"/modelroutes")
	var cols []string
	for _, c := range table.ColumnDefinitions {
		cols = append(cols, c.Name)
	}
	if want := []string{"Name", "Backends", "Cart", "Canary", "Wake", "Ready", "Synced", "Degraded", "Age"}; !reflect.DeepEqual(cols, want) {
		t.Errorf("printer columns %q, want %q", cols, want)
	}
	if len(table.Rows) != 2 {
		t.Fatalf("table rows: %d, want 2", len(table.Rows))
	}
	// No canary, no scale to zero: the columns are empty (nil).
	cells := fmt.Sprint(table.Rows[0].Cells[:8])
	if want := "[qwen 3 2 <nil> <nil> True 1/1 TierSkipped]"; cells != want {
		t.Errorf("row cells %s, want %s", cells, want)
	}
	cells = fmt.Sprint(table.Rows[1].Cells[:5])
	if want := "[qwen-canary 4 0 15 qwen-v2]"; cells != want {
		t.Errorf("canary row cells %s, want %s", cells, want)
	}
}

func getTable(ctx context.Context, t *testing.T, cfg *rest.Config, path string) metav1.Table {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.JoinPath(cfg.Host, path)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", u, resp.Status, body)
	}
	var table metav1.Table
	if err := json.Unmarshal(body, &table); err != nil {
		t.Fatalf("decode table: %v", err)
	}
	return table
}
