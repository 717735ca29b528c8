package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
)

// countingReader counts reads (the API reader: each is a GET).
type countingReader struct {
	client.Reader
	n atomic.Int64
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.n.Add(1)
	return c.Reader.Get(ctx, key, obj, opts...)
}

// applyAll runs one Apply per output at once through w, as concurrent
// reconciles of routes sharing a ConfigMap do.
func applyAll(t *testing.T, w *Writer, ns string, outs []compiler.Output, guard func(i int) Guard) []Outcome {
	t.Helper()
	res := make([]Outcome, len(outs))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for i, o := range outs {
		wg.Go(func() {
			var g Guard
			if guard != nil {
				g = guard(i)
			}
			r, err := w.Apply(context.Background(), ns, []compiler.Output{o}, g)
			mu.Lock()
			defer mu.Unlock()
			if err != nil || len(r) != 1 {
				errs = append(errs, fmt.Errorf("route %d: %v %v", i, r, err))
				return
			}
			res[i] = r[0]
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestBatchOnePatchForManyRoutes: 20 routes writing their keys into one
// ConfigMap at once go out as one or a few patches instead of 20, with one
// GET of the API server: the first read of the content (the new keys are
// guarded by its resourceVersion, not checked by another read).
func TestBatchOnePatchForManyRoutes(t *testing.T) {
	ns := setup(t, map[string]string{"base.conf": "keep"}, nil)
	pc := &patchCounter{Client: k8s}
	api := &countingReader{Reader: k8s}
	w := &Writer{Client: pc, APIReader: api, Window: 50 * time.Millisecond}
	var outs []compiler.Output
	for i := range 20 {
		outs = append(outs, out(ns, fmt.Sprintf("r%02d.conf", i), fmt.Sprintf("route %d\n", i)))
	}
	for i, o := range applyAll(t, w, ns, outs, nil) {
		if o.State != Written {
			t.Fatalf("route %d: %v", i, o)
		}
	}
	cm := get(t, ns)
	for i := range 20 {
		if got := cm.Data[fmt.Sprintf("r%02d.conf", i)]; got != fmt.Sprintf("route %d\n", i) {
			t.Fatalf("r%02d.conf = %q", i, got)
		}
	}
	if cm.Data["base.conf"] != "keep" {
		t.Fatal("the consumer's own key was lost")
	}
	if n := pc.n.Load(); n > 3 {
		t.Fatalf("%d patches for 20 routes in one window, want at most 3", n)
	}
	if n := api.n.Load(); n != 1 {
		t.Fatalf("%d GETs of the API server, want 1 (the first read of the content)", n)
	}
	t.Logf("20 routes → %d patch(es), %d batch(es)", pc.n.Load(), w.Batches.Load())

	// A second burst right after, the cache (here the API itself) may not
	// show our write yet: still correct, still batched.
	outs = outs[:0]
	for i := range 20 {
		outs = append(outs, out(ns, fmt.Sprintf("r%02d.conf", i), fmt.Sprintf("route %d v2\n", i)))
	}
	for i, o := range applyAll(t, w, ns, outs, nil) {
		if o.State != Written {
			t.Fatalf("second burst, route %d: %v", i, o)
		}
	}
	if got := get(t, ns).Data["r07.conf"]; got != "route 7 v2\n" {
		t.Fatalf("r07.conf = %q", got)
	}
}

// TestBatchRacingClaimsOfOneNewKey: ten routes claiming one new key in one
// batch: the first takes it, the others are decided again on the content
// with its mark and blocked by their guards.
func TestBatchRacingClaimsOfOneNewKey(t *testing.T) {
	ns := setup(t, map[string]string{"other": "x"}, nil)
	w := &Writer{Client: k8s, APIReader: k8s, Window: 50 * time.Millisecond}
	var outs []compiler.Output
	for i := range 10 {
		outs = append(outs, out(ns, "shared.conf", fmt.Sprintf("owner=%d\n", i)))
	}
	written, blocked := 0, 0
	for _, o := range applyAll(t, w, ns, outs, func(i int) Guard { return ownedBy(fmt.Sprint(i)) }) {
		if o.State == Written {
			written++
		}
		blocked += len(o.Blocked)
	}
	if written != 1 || blocked != 9 {
		t.Fatalf("%d wrote the new key, %d were blocked; want 1 and 9", written, blocked)
	}
}

// TestBatchFailuresStayWithTheirRoute: in one batch, a route whose render
// fails, one whose key the API server refuses and one too large for the
// ConfigMap each get their own state; the other routes are written.
func TestBatchFailuresStayWithTheirRoute(t *testing.T) {
	ns := setup(t, map[string]string{"big.conf": strings.Repeat("b", 900<<10)}, nil)
	w := &Writer{Client: k8s, APIReader: k8s, Window: 50 * time.Millisecond}
	outs := []compiler.Output{
		out(ns, "good1.conf", "1"),
		{ConfigMap: ns + "/cm", Key: "render.conf", Render: func([]byte) ([]byte, error) { return nil, errors.New("no base config") }},
		out(ns, "bad/key.conf", "x"),
		out(ns, "huge.conf", strings.Repeat("h", 200<<10)),
		out(ns, "good2.conf", "2"),
	}
	res := applyAll(t, w, ns, outs, nil)
	want := []State{Written, RenderFailed, Rejected, TooLarge, Written}
	for i, o := range res {
		if o.State != want[i] {
			t.Errorf("%s: %v, want %s", outs[i].Key, o, want[i])
		}
	}
	cm := get(t, ns)
	if cm.Data["good1.conf"] != "1" || cm.Data["good2.conf"] != "2" {
		t.Fatalf("good routes not written: %v %v", cm.Data["good1.conf"], cm.Data["good2.conf"])
	}
}

// TestBatchStaleReadIsRedone: a key changed behind the writer's back (its
// read is stale) fails the patch's test; the batch is decided again on a
// fresh read and renders from the new value.
func TestBatchStaleReadIsRedone(t *testing.T) {
	ns := setup(t, map[string]string{"a.conf": "1"}, nil)
	stale := get(t, ns)
	cur := get(t, ns)
	cur.Data["a.conf"] = "2"
	if err := k8s.Update(context.Background(), cur); err != nil {
		t.Fatal(err)
	}
	w := &Writer{Client: &staleReader{Client: k8s, stale: stale}, APIReader: k8s, Window: 10 * time.Millisecond}
	res, err := w.Apply(context.Background(), ns, []compiler.Output{{ConfigMap: ns + "/cm", Key: "a.conf", Render: func(in []byte) ([]byte, error) { return append(in, '+'), nil }}}, nil)
	if err != nil || res[0].State != Written {
		t.Fatalf("%v %v", res, err)
	}
	if got := get(t, ns).Data["a.conf"]; got != "2+" {
		t.Fatalf("a.conf = %q, want 2+", got)
	}
}

// TestConflictIsCounted: a patch based on content another writer has
// changed since (the cache not showing it yet) fails its per-key test, is
// counted (autoconfig_configmap_write_conflicts_total) and redone on a
// fresh read.
func TestConflictIsCounted(t *testing.T) {
	ns := setup(t, map[string]string{"a.conf": "1"}, nil)
	lc := &laggingCache{Client: k8s}
	w := &Writer{Client: lc, APIReader: k8s, Window: 10 * time.Millisecond}
	plus := []compiler.Output{{ConfigMap: ns + "/cm", Key: "a.conf", Render: func(in []byte) ([]byte, error) { return append(in, '+'), nil }}}
	if res, err := w.Apply(context.Background(), ns, plus, nil); err != nil || res[0].State != Written {
		t.Fatalf("%v %v", res, err)
	}
	ours := get(t, ns)
	lc.mu.Lock()
	lc.lag = ours // the cache stays at our own write
	lc.mu.Unlock()
	other := get(t, ns)
	other.Data["a.conf"] = "2"
	if err := k8s.Update(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	if res, err := w.Apply(context.Background(), ns, plus, nil); err != nil || res[0].State != Written {
		t.Fatalf("%v %v", res, err)
	}
	if got := get(t, ns).Data["a.conf"]; got != "2+" {
		t.Fatalf("a.conf = %q, want 2+", got)
	}
	if n := w.Conflicts.Load(); n != 1 {
		t.Errorf("Conflicts = %d, want 1", n)
	}
}

// laggingCache serves the ConfigMap as it was when lag was set, like an
// informer cache that has not delivered the latest events yet.
type laggingCache struct {
	client.Client
	mu  sync.Mutex
	lag *corev1.ConfigMap
}

func (l *laggingCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	l.mu.Lock()
	lag := l.lag
	l.mu.Unlock()
	if lag != nil {
		serve(lag, obj)
		return nil
	}
	return l.Client.Get(ctx, key, obj, opts...)
}

// TestBatchCacheBehindOurWritesNeedsNoRead: while the cache still shows a
// version our writes are based on (or one a patch test refused), the
// writer decides on what it wrote itself: consecutive batches need neither
// a fresh read nor a failed patch.
func TestBatchCacheBehindOurWritesNeedsNoRead(t *testing.T) {
	ns := setup(t, map[string]string{"base.conf": "keep"}, nil)
	cache := &laggingCache{Client: k8s, lag: get(t, ns)}
	api := &countingReader{Reader: k8s}
	pc := &patchCounter{Client: cache}
	w := &Writer{Client: pc, APIReader: api, Window: 5 * time.Millisecond}
	for i := range 10 {
		res, err := w.Apply(context.Background(), ns, []compiler.Output{out(ns, fmt.Sprintf("r%d.conf", i), "x")}, nil)
		if err != nil || res[0].State != Written {
			t.Fatalf("write %d: %v %v", i, res, err)
		}
	}
	if g := api.n.Load(); g != 1 {
		t.Fatalf("%d reads of the API server for 10 writes behind a lagging cache, want 1 (the first read of the content)", g)
	}
	if p := pc.n.Load(); p != 10 {
		t.Fatalf("%d successful patches, want 10", p)
	}
	// Someone else writes; the cache still lags: the patch test fails
	// once, the truth is read, and the write goes through.
	cur := get(t, ns)
	cur.Data["base.conf"] = "changed"
	if err := k8s.Update(context.Background(), cur); err != nil {
		t.Fatal(err)
	}
	res, err := w.Apply(context.Background(), ns, []compiler.Output{{ConfigMap: ns + "/cm", Key: "base.conf", Render: func(in []byte) ([]byte, error) { return append(in, '+'), nil }}}, nil)
	if err != nil || res[0].State != Written || get(t, ns).Data["base.conf"] != "changed+" {
		t.Fatalf("after a foreign write: %v %v %q", res, err, get(t, ns).Data["base.conf"])
	}
}
