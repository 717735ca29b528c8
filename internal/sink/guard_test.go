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
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
)

// ownedBy is a Guard for tests: a key may be written when it is absent or
// its value starts with "owner=<me>".
func ownedBy(me string) Guard {
	return func(cm *corev1.ConfigMap, key string) error {
		v, ok := cm.Data[key]
		if !ok || strings.HasPrefix(v, "owner="+me+"\n") {
			return nil
		}
		return fmt.Errorf("owned by someone else: %q", v)
	}
}

// TestGuardBlocksOneKey: a blocked key is reported and untouched, the
// route's other key in the same ConfigMap is written; Remove honours the
// guard the same way.
func TestGuardBlocksOneKey(t *testing.T) {
	ns := setup(t, map[string]string{"theirs.conf": "hand-written"}, nil)
	ctx := context.Background()
	w := &Writer{Client: k8s, APIReader: k8s}
	res, err := w.Apply(ctx, ns, []compiler.Output{out(ns, "theirs.conf", "owner=a\nx"), out(ns, "mine.conf", "owner=a\ny")}, ownedBy("a"))
	if err != nil || len(res) != 1 || res[0].State != Written || len(res[0].Blocked) != 1 || res[0].Blocked[0].Key != "theirs.conf" {
		t.Fatalf("apply: %v %v", res, err)
	}
	d := get(t, ns).Data
	if d["theirs.conf"] != "hand-written" || d["mine.conf"] != "owner=a\ny" {
		t.Fatalf("data: %v", d)
	}
	res, err = w.Remove(ctx, ns, map[string][]string{ns + "/cm": {"theirs.conf", "mine.conf"}}, ownedBy("a"))
	if err != nil || len(res[0].Blocked) != 1 {
		t.Fatalf("remove: %v %v", res, err)
	}
	if d := get(t, ns).Data; len(d) != 1 || d["theirs.conf"] != "hand-written" {
		t.Fatalf("after remove: %v", d)
	}
}

// TestRacingClaimsOfOneNewKey: ten writers with their own guards add the
// same absent key at once. The resourceVersion test of every addition of
// an absent key lets exactly one add it; every other one re-reads
// and is blocked by its guard. Without the test, JSON patch adds without
// any check and several win in turn (the last one's content stays).
func TestRacingClaimsOfOneNewKey(t *testing.T) {
	for round := range 5 {
		ns := setup(t, map[string]string{"other": "x"}, nil)
		ctx := context.Background()
		var wg sync.WaitGroup
		var mu sync.Mutex
		written, blocked := 0, 0
		start := make(chan struct{})
		for i := range 10 {
			wg.Go(func() {
				w := &Writer{Client: k8s, APIReader: k8s}
				me := fmt.Sprint(i)
				<-start
				res, err := w.Apply(ctx, ns, []compiler.Output{out(ns, "shared.conf", "owner="+me+"\n")}, ownedBy(me))
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("writer %d: %v", i, err)
					return
				}
				if res[0].State == Written {
					written++
				}
				blocked += len(res[0].Blocked)
			})
		}
		close(start)
		wg.Wait()
		if written != 1 || blocked != 9 {
			t.Fatalf("round %d: %d writers wrote the new key, %d were blocked; want 1 and 9", round, written, blocked)
		}
	}
}

// TestTooLarge: a write that would take the ConfigMap over 1 MiB is not
// sent; the error gives the size and the largest keys. A removal is
// never refused, and the write succeeds once space is freed.
func TestTooLarge(t *testing.T) {
	big := strings.Repeat("b", 900<<10)
	ns := setup(t, map[string]string{"big.conf": big, "small.conf": "s"}, nil)
	ctx := context.Background()
	w := &Writer{Client: k8s, APIReader: k8s}
	route := strings.Repeat("r", 200<<10)
	res, err := w.Apply(ctx, ns, []compiler.Output{out(ns, "route.conf", route)}, nil)
	if err != nil || res[0].State != TooLarge {
		t.Fatalf("apply: %v %v", res, err)
	}
	msg := res[0].Err.Error()
	for _, want := range []string{ns + "/cm would be 1.07 MiB", "route.conf (200.0 KiB)", "over the 1.00 MiB limit", "largest keys are big.conf (900.0 KiB), route.conf (200.0 KiB), small.conf (1 B)"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if _, ok := get(t, ns).Data["route.conf"]; ok {
		t.Fatal("written anyway")
	}
	// The API server's own limit is the same: sending it would fail.
	cm := get(t, ns)
	cm.Data["route.conf"] = route
	if err := k8s.Update(ctx, cm); err == nil || !strings.Contains(err.Error(), "Too long") {
		t.Fatalf("API server accepted %d bytes: %v", len(big)+len(route)+1, err)
	}
	res, err = w.Remove(ctx, ns, map[string][]string{ns + "/cm": {"big.conf"}}, nil)
	if err != nil || res[0].State != Written {
		t.Fatalf("remove: %v %v", res, err)
	}
	res, err = w.Apply(ctx, ns, []compiler.Output{out(ns, "route.conf", route)}, nil)
	if err != nil || res[0].State != Written {
		t.Fatalf("after freeing: %v %v", res, errors.Join(err, res[0].Err))
	}
}

// TestForbidden: an identity that may read but not patch ConfigMaps (RBAC
// on the real API server) gets Forbidden with the API's words, not an
// error to retry.
func TestForbidden(t *testing.T) {
	ns := setup(t, map[string]string{"x": "y"}, nil)
	ctx := context.Background()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "read-cm"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "read-cm"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "read-cm"},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: "reader", APIGroup: "rbac.authorization.k8s.io"}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(testCfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "reader"}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w := &Writer{Client: c, APIReader: c}
	var res []Outcome
	// RBAC may take a moment to see the new binding: a read must work first.
	for range 100 {
		if err = c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cm"}, &corev1.ConfigMap{}); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("reader cannot read: %v", err)
	}
	res, err = w.Apply(ctx, ns, []compiler.Output{out(ns, "a.conf", "x")}, nil)
	if err != nil || res[0].State != Forbidden || !strings.Contains(res[0].Err.Error(), `User "reader" cannot patch resource "configmaps"`) {
		t.Fatalf("%v %v", res, err)
	}
}

// callCounter counts every ConfigMap read and patch, failed or not.
type callCounter struct {
	client.Client
	gets, patches atomic.Int64
}

func (c *callCounter) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.gets.Add(1)
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c *callCounter) Patch(ctx context.Context, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
	c.patches.Add(1)
	return c.Client.Patch(ctx, obj, p, opts...)
}

// TestInvalidWriteIsNotRetriedAsAFailedTest: the API server answers both a
// failed JSON-patch test and an invalid ConfigMap with 422. Only the first
// means our read was behind; the second used to be retried like it (eight
// GETs and eight patches per reconcile, then an error, requeued forever).
// Now an invalid write is tried once more on a fresh read and then
// reported Rejected with the API's words; a stale read is still retried.
func TestInvalidWriteIsNotRetriedAsAFailedTest(t *testing.T) {
	ns := setup(t, map[string]string{"a.conf": "1"}, nil)
	ctx := context.Background()
	c := &callCounter{Client: k8s}
	w := &Writer{Client: c, APIReader: c}
	res, err := w.Apply(ctx, ns, []compiler.Output{out(ns, "bad/key.conf", "x")}, nil)
	if err != nil || len(res) != 1 || res[0].State != Rejected || !strings.Contains(res[0].Err.Error(), "a valid config key must consist of") {
		t.Fatalf("apply: %v %v", res, err)
	}
	if g, p := c.gets.Load(), c.patches.Load(); p > 2 || g > 2 {
		t.Fatalf("%d GETs and %d patches for an invalid write, want at most 2 each", g, p)
	}

	// A stale read (the key changed underneath): the test fails, and the
	// fresh read renders from the new value.
	stale := get(t, ns)
	cur := get(t, ns)
	cur.Data["a.conf"] = "2"
	if err := k8s.Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	err = k8s.Patch(ctx, stale, client.RawPatch(jsonPatch, []byte(`[{"op":"test","path":"/data/a.conf","value":"1"}]`)))
	if !patchNotApplicable(err) {
		t.Fatalf("a failed test is not recognised: %v", err)
	}
	r := &staleReader{Client: k8s, stale: stale}
	w = &Writer{Client: r, APIReader: k8s}
	res, err = w.Apply(ctx, ns, []compiler.Output{{ConfigMap: ns + "/cm", Key: "a.conf", Render: func(in []byte) ([]byte, error) { return append(in, '+'), nil }}}, nil)
	if err != nil || res[0].State != Written {
		t.Fatalf("apply on a stale read: %v %v", res, err)
	}
	if got := get(t, ns).Data["a.conf"]; got != "2+" {
		t.Fatalf("a.conf = %q, want 2+ (rendered from the fresh read)", got)
	}
}

// staleReader serves one stale copy of the ConfigMap (a cache behind).
type staleReader struct {
	client.Client
	stale *corev1.ConfigMap
}

func (s *staleReader) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	serve(s.stale, obj)
	return nil
}

// serve answers a read of obj (the ConfigMap or its metadata) with cm.
func serve(cm *corev1.ConfigMap, obj client.Object) {
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		cm.DeepCopyInto(o)
	case *metav1.PartialObjectMetadata:
		cm.ObjectMeta.DeepCopyInto(&o.ObjectMeta)
	default:
		panic(fmt.Sprintf("unexpected read of %T", obj))
	}
}
