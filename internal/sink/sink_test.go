package sink

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/testenv"
)

var (
	k8s     client.Client
	testCfg *rest.Config
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	_, cfg, stop, err := testenv.StartForMain()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	testCfg = cfg
	if k8s, err = client.New(cfg, client.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// patchCounter counts successful ConfigMap patches.
type patchCounter struct {
	client.Client
	n atomic.Int64
}

func (c *patchCounter) Patch(ctx context.Context, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
	err := c.Client.Patch(ctx, obj, p, opts...)
	if err == nil {
		c.n.Add(1)
	}
	return err
}

var nsSeq atomic.Int64

func setup(t testing.TB, data map[string]string, annotations map[string]string) (ns string) {
	t.Helper()
	ctx := context.Background()
	ns = fmt.Sprintf("sink-%d", nsSeq.Add(1))
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if data != nil {
		if err := k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cm", Annotations: annotations}, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	return ns
}

func out(ns, key, content string) compiler.Output {
	return compiler.Output{ConfigMap: ns + "/cm", Key: key, Render: func([]byte) ([]byte, error) { return []byte(content), nil }}
}

func get(t *testing.T, ns string) *corev1.ConfigMap {
	t.Helper()
	var cm corev1.ConfigMap
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "cm"}, &cm); err != nil {
		t.Fatal(err)
	}
	return &cm
}

// Twenty independent writers (separate Writers, so no shared lock: as if
// in twenty processes) read the API directly, so every stale read is a real
// conflict that must be retried without losing anyone's key.
func TestTwentyConcurrentWritersOneConfigMap(t *testing.T) {
	ns := setup(t, map[string]string{"base": "keep"}, nil)
	ctx := context.Background()
	var wg sync.WaitGroup
	var writes atomic.Int64
	for i := range 20 {
		wg.Go(func() {
			c := &patchCounter{Client: k8s}
			w := &Writer{Client: c, APIReader: k8s}
			for round := range 3 {
				res, err := w.Apply(ctx, ns, []compiler.Output{out(ns, fmt.Sprintf("r%02d.conf", i), fmt.Sprintf("route %d round %d", i, round))}, nil)
				if err != nil {
					t.Errorf("writer %d: %v", i, err)
					return
				}
				if res[0].State != Written {
					t.Errorf("writer %d round %d: %v", i, round, res[0])
				}
			}
			writes.Add(c.n.Load())
		})
	}
	wg.Wait()
	cm := get(t, ns)
	for i := range 20 {
		if v := cm.Data[fmt.Sprintf("r%02d.conf", i)]; v != fmt.Sprintf("route %d round 2", i) {
			t.Errorf("r%02d = %q", i, v)
		}
	}
	if cm.Data["base"] != "keep" || len(cm.Data) != 21 {
		t.Fatalf("keys: %v", cm.Data)
	}
	if writes.Load() != 60 {
		t.Fatalf("%d successful patches for 60 changes", writes.Load())
	}

	// Same content again: nothing written.
	c := &patchCounter{Client: k8s}
	w := &Writer{Client: c, APIReader: k8s}
	res, err := w.Apply(ctx, ns, []compiler.Output{out(ns, "r00.conf", "route 0 round 2")}, nil)
	if err != nil || res[0].State != Unchanged || c.n.Load() != 0 {
		t.Fatalf("no-op: %v %v writes=%d", res, err, c.n.Load())
	}
}

// An output rendered from the current content (the CART config) is
// re-rendered after a conflict, so a concurrent base change is kept.
func TestRenderFromCurrentSurvivesConcurrentBaseChange(t *testing.T) {
	ns := setup(t, map[string]string{"config.yaml": "base: 1\n"}, nil)
	ctx := context.Background()
	var once sync.Once
	render := func(cur []byte) ([]byte, error) {
		// Between our read and our write, the CART chart changes the base.
		once.Do(func() {
			cm := get(t, ns)
			cm.Data["config.yaml"] = "base: 2\n"
			if err := k8s.Update(ctx, cm); err != nil {
				t.Error(err)
			}
		})
		return []byte(strings.SplitN(string(cur), "workers", 2)[0] + "workers: [a]\n"), nil
	}
	w := &Writer{Client: k8s, APIReader: k8s}
	res, err := w.Apply(ctx, ns, []compiler.Output{{ConfigMap: ns + "/cm", Key: "config.yaml", Render: render}}, nil)
	if err != nil || res[0].State != Written {
		t.Fatalf("%v %v", res, err)
	}
	if v := get(t, ns).Data["config.yaml"]; v != "base: 2\nworkers: [a]\n" {
		t.Fatalf("lost the base change: %q", v)
	}
}

func TestMissingNotPermittedRemove(t *testing.T) {
	ctx := context.Background()
	w := &Writer{Client: k8s, APIReader: k8s}

	ns := setup(t, nil, nil)
	res, err := w.Apply(ctx, ns, []compiler.Output{out(ns, "a.conf", "x")}, nil)
	if err != nil || res[0].State != Missing {
		t.Fatalf("missing: %v %v", res, err)
	}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cm"}, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Fatalf("ConfigMap created: %v", err)
	}

	other := setup(t, map[string]string{"x": "y"}, map[string]string{AllowedNamespacesAnnotation: "a, b"})
	res, err = w.Apply(ctx, "c", []compiler.Output{out(other, "a.conf", "x")}, nil)
	if err != nil || res[0].State != NotPermitted || len(get(t, other).Data) != 1 {
		t.Fatalf("not permitted: %v %v", res, err)
	}
	res, err = w.Apply(ctx, "b", []compiler.Output{out(other, "a.conf", "x"), out(other, "b.conf", "y")}, nil)
	if err != nil || res[0].State != Written || len(get(t, other).Data) != 3 {
		t.Fatalf("permitted: %v %v", res, err)
	}
	res, err = w.Remove(ctx, "b", map[string][]string{other + "/cm": {"a.conf", "gone.conf"}, ns + "/cm": {"a.conf"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := get(t, other).Data; len(d) != 2 || d["b.conf"] != "y" || d["x"] != "y" {
		t.Fatalf("remove: %v %v", d, res)
	}
}

func TestGranted(t *testing.T) {
	cm := func(ns, ann string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Annotations: map[string]string{AllowedNamespacesAnnotation: ann}}}
	}
	for _, c := range []struct {
		cm      *corev1.ConfigMap
		ns      string
		trusted []string
		want    bool
	}{
		{cm("a", ""), "a", nil, true},
		{cm("a", ""), "b", nil, false},
		{cm("a", "*"), "b", nil, true},
		{cm("a", "x, b ,y"), "b", nil, true},
		{cm("a", "bb"), "b", nil, false},
		{cm("a", ","), "", nil, false},
		{cm("a", ""), "b", []string{"b"}, true},
		{cm("a", ""), "b", []string{"bb", "c"}, false},
	} {
		if got := Granted(c.cm, c.ns, c.trusted); got != c.want {
			t.Errorf("Granted(%s %q, %s, trusted %v) = %v", c.cm.Namespace, c.cm.Annotations[AllowedNamespacesAnnotation], c.ns, c.trusted, got)
		}
	}
}
