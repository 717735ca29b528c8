package sink

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
)

// TestDryRunAgreesWithWriter: for each situation, DryRun's Outcomes
// (State, Err, Blocked, Changes, Sums, and the Sums it records) are the
// ones Writer then returns, DryRun writes nothing (the resourceVersion
// stays), and the Writer does what the Changes say: exactly those keys
// changed, from Live to Want. Unbatched and with the controller's window.
func TestDryRunAgreesWithWriter(t *testing.T) {
	ctx := context.Background()
	nobody := impersonating(t, "nobody") // no RBAC at all: every read is refused
	big := strings.Repeat("b", 900<<10)
	failing := func(ns string) compiler.Output {
		return compiler.Output{ConfigMap: ns + "/cm", Key: "render.conf", Render: func([]byte) ([]byte, error) { return nil, errors.New("no base config") }}
	}
	apply := func(outs func(ns string) []compiler.Output, guard Guard) func(KeyWriter, string, string, func(string, map[string]Sum)) ([]Outcome, error) {
		return func(k KeyWriter, ns, routeNS string, record func(string, map[string]Sum)) ([]Outcome, error) {
			return k.ApplyRecorded(ctx, routeNS, outs(ns), guard, record)
		}
	}
	remove := func(keys []string, guard Guard) func(KeyWriter, string, string, func(string, map[string]Sum)) ([]Outcome, error) {
		return func(k KeyWriter, ns, routeNS string, _ func(string, map[string]Sum)) ([]Outcome, error) {
			return k.Remove(ctx, routeNS, map[string][]string{ns + "/cm": keys}, guard)
		}
	}
	check := func(keys []string, guard Guard) func(KeyWriter, string, string, func(string, map[string]Sum)) ([]Outcome, error) {
		return func(k KeyWriter, ns, routeNS string, _ func(string, map[string]Sum)) ([]Outcome, error) {
			return k.Check(ctx, routeNS, map[string][]string{ns + "/cm": keys}, guard)
		}
	}
	one := func(key, content string) func(ns string) []compiler.Output {
		return func(ns string) []compiler.Output { return []compiler.Output{out(ns, key, content)} }
	}
	cases := []struct {
		name        string
		data        map[string]string // nil: no ConfigMap
		annotations map[string]string
		routeNS     string // "": the ConfigMap's namespace
		trusted     []string
		reader      client.Client // nil: the test's client
		do          func(k KeyWriter, ns, routeNS string, record func(string, map[string]Sum)) ([]Outcome, error)
		want        State
	}{
		{name: "absent ConfigMap", do: apply(one("a.conf", "x"), nil), want: Missing},
		{name: "ungranted namespace", data: map[string]string{"x": "y"}, routeNS: "elsewhere", do: apply(one("a.conf", "x"), nil), want: NotPermitted},
		{name: "granted by annotation", data: map[string]string{"x": "y"}, annotations: map[string]string{AllowedNamespacesAnnotation: "a, elsewhere"}, routeNS: "elsewhere", do: apply(one("a.conf", "x"), nil), want: Written},
		{name: "trusted namespace", data: map[string]string{"x": "y"}, routeNS: "platform", trusted: []string{"platform"}, do: apply(one("a.conf", "x"), nil), want: Written},
		{name: "guard blocks a key", data: map[string]string{"theirs.conf": "hand-written"}, do: apply(func(ns string) []compiler.Output {
			return []compiler.Output{out(ns, "theirs.conf", "owner=a\nx"), out(ns, "mine.conf", "owner=a\ny")}
		}, ownedBy("a")), want: Written},
		{name: "render fails", data: map[string]string{"x": "y"}, do: apply(func(ns string) []compiler.Output {
			return []compiler.Output{out(ns, "ok.conf", "1"), failing(ns)}
		}, nil), want: RenderFailed},
		{name: "over MaxSize", data: map[string]string{"big.conf": big, "small.conf": "s"}, do: apply(one("route.conf", strings.Repeat("r", 200<<10)), nil), want: TooLarge},
		{name: "unchanged", data: map[string]string{"a.conf": "same"}, do: apply(one("a.conf", "same"), nil), want: Unchanged},
		{name: "new key", data: map[string]string{"x": "y"}, do: apply(one("a.conf", "new"), nil), want: Written},
		{name: "changed key", data: map[string]string{"a.conf": "old", "x": "y"}, do: apply(one("a.conf", "new"), nil), want: Written},
		{name: "new and changed keys", data: map[string]string{"b.conf": "old"}, do: apply(func(ns string) []compiler.Output {
			return []compiler.Output{out(ns, "b.conf", "new"), out(ns, "a.conf", "new")}
		}, nil), want: Written},
		{name: "read refused by RBAC", data: map[string]string{"x": "y"}, reader: nobody, do: apply(one("a.conf", "x"), nil), want: Forbidden},
		{name: "remove an owned key", data: map[string]string{"mine.conf": "owner=a\nx", "theirs.conf": "owner=b\nx"}, do: remove([]string{"mine.conf", "theirs.conf", "gone.conf"}, ownedBy("a")), want: Written},
		{name: "remove from an absent ConfigMap", do: remove([]string{"mine.conf"}, nil), want: Missing},
		{name: "remove a foreign key only", data: map[string]string{"theirs.conf": "owner=b\nx"}, do: remove([]string{"theirs.conf"}, ownedBy("a")), want: Unchanged},
		{name: "check", data: map[string]string{"theirs.conf": "owner=b\nx"}, do: check([]string{"theirs.conf", "mine.conf"}, ownedBy("a")), want: Unchanged},
		{name: "check ungranted", data: map[string]string{"x": "y"}, routeNS: "elsewhere", do: check([]string{"a.conf"}, nil), want: NotPermitted},
	}
	for _, window := range []time.Duration{0, DefaultBatchWindow} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("window=%s/%s", window, c.name), func(t *testing.T) {
				ns := setup(t, c.data, c.annotations)
				routeNS := c.routeNS
				if routeNS == "" {
					routeNS = ns
				}
				reader := c.reader
				if reader == nil {
					reader = k8s
				}
				before := lookup(t, ns)

				var dryRec, wetRec []string
				dry, dryErr := c.do(DryRun{Reader: reader, Trusted: c.trusted}, ns, routeNS, recorder(&dryRec))
				if dryErr != nil {
					t.Fatalf("dry run: %v", dryErr)
				}
				if after := lookup(t, ns); after.ResourceVersion != before.ResourceVersion {
					t.Fatalf("the dry run wrote: resourceVersion %s → %s", before.ResourceVersion, after.ResourceVersion)
				}

				w := &Writer{Client: reader, APIReader: reader, Trusted: c.trusted, Window: window}
				wet, wetErr := c.do(w, ns, routeNS, recorder(&wetRec))
				if wetErr != nil {
					t.Fatalf("write: %v", wetErr)
				}
				if len(dry) != 1 || len(wet) != 1 {
					t.Fatalf("outcomes: dry run %v, writer %v; want one each", dry, wet)
				}
				if d, w := describe(dry[0]), describe(wet[0]); d != w {
					t.Errorf("the dry run and the writer disagree:\ndry run: %s\nwriter:  %s", d, w)
				}
				if !slices.Equal(dryRec, wetRec) {
					t.Errorf("recorded sums differ:\ndry run: %v\nwriter:  %v", dryRec, wetRec)
				}
				if got := wet[0].State; got != c.want {
					t.Errorf("state %s, want %s: %v", got, c.want, wet[0])
				}
				if (wet[0].State == Written) != (len(wet[0].Changes) > 0) {
					t.Errorf("%s with %d changes", wet[0].State, len(wet[0].Changes))
				}

				// The writer did what the Changes say, and nothing else.
				after := lookup(t, ns)
				if wet[0].State != Written {
					if after.ResourceVersion != before.ResourceVersion {
						t.Fatalf("%s but written: resourceVersion %s → %s", wet[0].State, before.ResourceVersion, after.ResourceVersion)
					}
					return
				}
				want := maps.Clone(before.Data)
				if want == nil {
					want = map[string]string{}
				}
				for _, ch := range wet[0].Changes {
					if live, ok := before.Data[ch.Key]; (ch.Live == nil) == ok || (ok && *ch.Live != live) {
						t.Errorf("change of %s: Live %s, the ConfigMap held %q (present: %v)", ch.Key, show(ch.Live), abbrev(live), ok)
					}
					if ch.Want == nil {
						delete(want, ch.Key)
					} else {
						want[ch.Key] = *ch.Want
					}
				}
				if !maps.Equal(after.Data, want) {
					t.Errorf("after the write: %v, want %v", abbrevMap(after.Data), abbrevMap(want))
				}
			})
		}
	}
}

// TestUnbatchedWritesGoThroughTheBatch: with Window 0 every Apply and
// Remove is a batch of the ConfigMap's writer (Batches counts it; Check
// writes nothing and is none), and writes that arrive while the writer is
// busy go out together, one patch per batch.
func TestUnbatchedWritesGoThroughTheBatch(t *testing.T) {
	ctx := context.Background()
	ns := setup(t, map[string]string{"base.conf": "keep"}, nil)
	pc := &patchCounter{Client: k8s}
	w := &Writer{Client: pc, APIReader: k8s}
	steps := []struct {
		name string
		do   func() ([]Outcome, error)
		want State
	}{
		{"apply", func() ([]Outcome, error) { return w.Apply(ctx, ns, []compiler.Output{out(ns, "a.conf", "1")}, nil) }, Written},
		{"apply again", func() ([]Outcome, error) { return w.Apply(ctx, ns, []compiler.Output{out(ns, "a.conf", "1")}, nil) }, Unchanged},
		{"remove", func() ([]Outcome, error) { return w.Remove(ctx, ns, map[string][]string{ns + "/cm": {"a.conf"}}, nil) }, Written},
	}
	for i, s := range steps {
		res, err := s.do()
		if err != nil || len(res) != 1 || res[0].State != s.want {
			t.Fatalf("%s: %v %v, want %s", s.name, res, err, s.want)
		}
		if n := w.Batches.Load(); n != int64(i+1) {
			t.Fatalf("after %s: %d batches, want %d", s.name, n, i+1)
		}
	}
	if _, err := w.Check(ctx, ns, map[string][]string{ns + "/cm": {"a.conf"}}, nil); err != nil {
		t.Fatal(err)
	}
	if n := w.Batches.Load(); n != 3 {
		t.Fatalf("Check made a batch: %d", n)
	}

	// Twenty routes at once.
	batches, patches := w.Batches.Load(), pc.n.Load()
	var outs []compiler.Output
	for i := range 20 {
		outs = append(outs, out(ns, fmt.Sprintf("r%02d.conf", i), "x"))
	}
	for i, o := range applyAll(t, w, ns, outs, nil) {
		if o.State != Written {
			t.Fatalf("route %d: %v", i, o)
		}
	}
	b, p := w.Batches.Load()-batches, pc.n.Load()-patches
	if b < 1 || b > 20 || p != b {
		t.Fatalf("20 concurrent writes: %d batches, %d patches; want one patch per batch, at most 20", b, p)
	}
	t.Logf("20 concurrent writes with Window 0: %d batches", b)
}

// TestUnbatchedNewKeyClaimIsGuardedByResourceVersion: writer A, with Window
// 0 and a guard that allows the absent key, decides to
// add a key; before its patch, writer B (another process) adds the same
// key. A's patch tests the resourceVersion of the content it decided on,
// fails, and A, deciding again on the truth, is blocked by its guard: B's
// key stays. (Without the test, A's addition would replace B's.)
func TestUnbatchedNewKeyClaimIsGuardedByResourceVersion(t *testing.T) {
	ctx := context.Background()
	ns := setup(t, map[string]string{"other": "x"}, nil)
	b := &Writer{Client: k8s, APIReader: k8s}
	a := &Writer{Client: k8s, APIReader: k8s}
	var once sync.Once
	decisions := 0
	guardA := func(cm *corev1.ConfigMap, key string) error {
		decisions++
		once.Do(func() {
			res, err := b.Apply(ctx, ns, []compiler.Output{out(ns, "shared.conf", "owner=b\n")}, ownedBy("b"))
			if err != nil || res[0].State != Written {
				t.Errorf("writer B: %v %v", res, err)
			}
		})
		return ownedBy("a")(cm, key)
	}
	res, err := a.Apply(ctx, ns, []compiler.Output{out(ns, "shared.conf", "owner=a\n")}, guardA)
	if err != nil || len(res) != 1 {
		t.Fatalf("writer A: %v %v", res, err)
	}
	if res[0].State != Unchanged || len(res[0].Blocked) != 1 || res[0].Blocked[0].Key != "shared.conf" {
		t.Fatalf("writer A: %v, want Unchanged with shared.conf blocked", res[0])
	}
	if got := get(t, ns).Data["shared.conf"]; got != "owner=b\n" {
		t.Fatalf("shared.conf = %q, want B's", got)
	}
	if decisions != 2 || a.Conflicts.Load() != 1 || a.Batches.Load() != 1 {
		t.Fatalf("writer A: %d decisions, %d conflicts, %d batches; want 2, 1 and 1", decisions, a.Conflicts.Load(), a.Batches.Load())
	}
}

// impersonating is a client acting as user.
func impersonating(t *testing.T, user string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(testCfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// lookup reads ns/cm; an absent ConfigMap is an empty one.
func lookup(t *testing.T, ns string) *corev1.ConfigMap {
	t.Helper()
	var cm corev1.ConfigMap
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "cm"}, &cm); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return &cm
}

// recorder is an ApplyRecorded record that notes each call in *calls.
func recorder(calls *[]string) func(string, map[string]Sum) {
	var mu sync.Mutex
	return func(cm string, sums map[string]Sum) {
		mu.Lock()
		defer mu.Unlock()
		*calls = append(*calls, cm+" "+showSums(sums))
	}
}

// describe is o in full, long values abbreviated.
func describe(o Outcome) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s keys=%v", o.ConfigMap, o.State, o.Keys)
	if o.Err != nil {
		fmt.Fprintf(&b, " err=%q", o.Err)
	}
	for _, k := range o.Blocked {
		fmt.Fprintf(&b, "; blocked %s: %v", k.Key, k.Err)
	}
	for _, c := range o.Changes {
		fmt.Fprintf(&b, "; change %s: %s → %s", c.Key, show(c.Live), show(c.Want))
	}
	if o.Sums != nil {
		fmt.Fprintf(&b, "; sums %s", showSums(o.Sums))
	}
	return b.String()
}

func showSums(sums map[string]Sum) string {
	var s []string
	for _, k := range slices.Sorted(maps.Keys(sums)) {
		sum := sums[k]
		s = append(s, fmt.Sprintf("%s=%x", k, sum[:4]))
	}
	return "{" + strings.Join(s, " ") + "}"
}

func show(v *string) string {
	if v == nil {
		return "<none>"
	}
	return fmt.Sprintf("%q", abbrev(*v))
}

func abbrev(v string) string {
	if len(v) <= 40 {
		return v
	}
	return fmt.Sprintf("<%d bytes %x>", len(v), sha256.Sum256([]byte(v)))
}

func abbrevMap(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = abbrev(v)
	}
	return out
}
