package informer

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/modelsphere/autoconfig/internal/testenv"
)

// TestPodCacheGoroutines: a running pod cache is one goroutine of its own
// and its watch's two (the stream decoder and the HTTP/2 stream), at most
// 3. A client-go informer per cache was about 10: with 100 selector
// routes, 1,000 goroutines and most of what they added to the
// controller's memory.
func TestPodCacheGoroutines(t *testing.T) {
	const n = 20
	ns := namespace(t, "podgo")
	for i := range n {
		pod(t, ns, fmt.Sprintf("p-%d", i), map[string]string{"app": "go", "idx": fmt.Sprint(i)}, fmt.Sprintf("10.6.0.%d", i+1), true, 8000)
	}
	hc, err := podCachesClient(testCfg)
	must(t, err)
	p := &PodCaches{cfg: testCfg, httpClient: hc, idle: time.Minute, currency: NewCacheCurrency()}
	t.Cleanup(func() { stopPodCaches(p) })
	ctx := context.Background()
	// The caches' shared connection (and its goroutines) first.
	if _, err := p.Reader(ctx, ns, "app=none"); err != nil {
		t.Fatal(err)
	}
	before := settledGoroutines()
	for i := range n {
		r, err := p.Reader(ctx, ns, fmt.Sprintf("idx=%d", i))
		if err != nil {
			t.Fatal(err)
		}
		var l corev1.PodList
		must(t, r.List(ctx, &l))
		if len(l.Items) != 1 || l.Items[0].Name != fmt.Sprintf("p-%d", i) {
			t.Fatalf("cache idx=%d holds %d pods, want p-%d", i, len(l.Items), i)
		}
	}
	// Every cache's watch is open: a pod change reaches each.
	for i := range n {
		var pd corev1.Pod
		must(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("p-%d", i)}, &pd))
		pd.Labels["seen"] = "1"
		must(t, k8s.Update(ctx, &pd))
	}
	eventually(t, "every cache to see its pod's change", func() (bool, string) {
		for k, e := range p.synced() {
			if k.Selector == "app=none" {
				continue
			}
			for _, pd := range e.cache.snapshot() {
				if pd.Labels()["seen"] != "1" {
					return false, k.String()
				}
			}
		}
		return true, ""
	})
	after := settledGoroutines()
	t.Logf("%d pod caches: %d goroutines more (%.1f each)", n, after-before, float64(after-before)/n)
	if after-before > 3*n {
		t.Errorf("%d pod caches added %d goroutines (%.1f each), want at most 3 each", n, after-before, float64(after-before)/n)
	}

	// Stopped, they end.
	stopPodCaches(p)
	eventually(t, "the stopped caches' goroutines to end", func() (bool, string) {
		g := runtime.NumGoroutine()
		return g <= before-3, fmt.Sprintf("%d goroutines, %d before the caches", g, before)
	})
}

// stopPodCaches stops every cache of p, as the manager's shutdown does.
func stopPodCaches(p *PodCaches) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, e := range p.byKey {
		if e.stop != nil {
			e.stop()
		}
		delete(p.byKey, k)
	}
}

// settledGoroutines is the number of goroutines once it has not changed
// for half a second (at most 10 s): goroutines that were just started or
// stopped are counted or gone.
func settledGoroutines() int {
	last, same := runtime.NumGoroutine(), 0
	for range 200 {
		time.Sleep(50 * time.Millisecond)
		g := runtime.NumGoroutine()
		if g != last {
			last, same = g, 0
			continue
		}
		if same++; same == 10 {
			break
		}
	}
	return last
}

// podRequests is the pod caches' transport in TestPodCacheResumesAndRelists:
// it records their requests ("list <resourceVersion>", "watch
// <resourceVersion>") and answers some itself.
type podRequests struct {
	inner http.RoundTripper

	mu  sync.Mutex
	log []string
	// expire answers the next watch with the error event of a version
	// too old to resume from (410 Expired), as the API server does.
	expire bool
	// refuse answers lists with 503: the API server is not ready.
	refuse bool
}

func (p *podRequests) RoundTrip(req *http.Request) (*http.Response, error) {
	q := req.URL.Query()
	kind := "list"
	if q.Get("watch") == "true" {
		kind = "watch"
	}
	p.mu.Lock()
	p.log = append(p.log, kind+" "+q.Get("resourceVersion"))
	expire := kind == "watch" && p.expire
	if expire {
		p.expire = false
	}
	refuse := kind == "list" && p.refuse
	p.mu.Unlock()
	answer := func(code int, body string) *http.Response {
		return &http.Response{StatusCode: code, Status: http.StatusText(code), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body)), Request: req}
	}
	switch {
	case expire:
		return answer(http.StatusOK, `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",`+
			`"message":"too old resource version","reason":"Expired","code":410}}`+"\n"), nil
	case refuse:
		return answer(http.StatusServiceUnavailable, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",`+
			`"message":"not ready","reason":"ServiceUnavailable","code":503}`), nil
	}
	return p.inner.RoundTrip(req)
}

// requests returns the requests since the last call.
func (p *podRequests) requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.log
	p.log = nil
	return out
}

func (p *podRequests) set(expire, refuse bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expire, p.refuse = expire, refuse
}

// watchFrom tells whether req (podRequests) is a watch from version rv or
// a later one (a bookmark may have come after the last event).
func watchFrom(req, rv string) bool {
	v, ok := strings.CutPrefix(req, "watch ")
	if !ok {
		return false
	}
	a, errA := strconv.ParseUint(v, 10, 64)
	b, errB := strconv.ParseUint(rv, 10, 64)
	return errA == nil && errB == nil && a >= b
}

// podEventLog records what a pod cache hands its handlers.
type podEventLog struct {
	mu     sync.Mutex
	events []string // "create a", "update a", "delete b"
	// objects are the pods of the events, the new one for updates.
	objects []*corev1.Pod
	olds    []*corev1.Pod // the old one of updates, nil for the others
}

func (l *podEventLog) add(what string, o, old client.Object) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, what+" "+o.GetName())
	l.objects = append(l.objects, o.(*corev1.Pod))
	op, _ := old.(*corev1.Pod)
	l.olds = append(l.olds, op)
}

// take returns the events recorded since the last call.
func (l *podEventLog) take() (events []string, objects, olds []*corev1.Pod) {
	l.mu.Lock()
	defer l.mu.Unlock()
	events, objects, olds = l.events, l.objects, l.olds
	l.events, l.objects, l.olds = nil, nil, nil
	return events, objects, olds
}

func (l *podEventLog) handler() handler.EventHandler {
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			l.add("create", e.Object, nil)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			l.add("update", e.ObjectNew, e.ObjectOld)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			l.add("delete", e.Object, nil)
		},
	}
}

// TestPodCacheResumesAndRelists: a pod cache whose watch is cut resumes it
// at once from the last version it saw (no list, the cache stays
// current); one whose watch cannot be resumed (410 Expired: the version is
// too old) is stale until the API server answers a list, then holds what
// changed meanwhile, has handed the handlers the difference (deletions
// first) and only then is current; a stale cache that is stopped does not
// leave the controller stale.
func TestPodCacheResumesAndRelists(t *testing.T) {
	ns := namespace(t, "podcut")
	lbl := map[string]string{"app": "cut"}
	pod(t, ns, "a", lbl, "10.5.0.1", true, 8000)
	pod(t, ns, "b", lbl, "10.5.0.2", true, 8000)

	proxy := testenv.NewTCPProxy(t, strings.TrimSuffix(strings.TrimPrefix(testCfg.Host, "https://"), "/"), testenv.ProxyForward)
	cfg := rest.CopyConfig(testCfg)
	cfg.Host = "https://" + proxy.Addr()
	hc, err := podCachesClient(cfg)
	must(t, err)
	reqs := &podRequests{inner: hc.Transport}
	hc.Transport = reqs
	cur := NewCacheCurrency()
	p := &PodCaches{cfg: cfg, httpClient: hc, idle: time.Minute, currency: cur}
	t.Cleanup(func() { stopPodCaches(p) })
	rec := &podEventLog{}
	p.events = &podEvents{caches: p, h: rec.handler()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	must(t, p.events.Start(ctx, q))
	r, err := p.Reader(ctx, ns, "app=cut")
	must(t, err)
	w := p.synced()[PodKey{ns, "app=cut"}].cache

	// The listed pods reach the handlers as the cache's stored, stripped
	// pods.
	eventually(t, "the listed pods' events", func() (bool, string) {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.events) == 2, fmt.Sprint(rec.events)
	})
	events, objs, _ := rec.take()
	slices.Sort(events)
	if !slices.Equal(events, []string{"create a", "create b"}) {
		t.Fatalf("events of the listed pods %v, want create a, create b", events)
	}
	for _, o := range objs {
		if !cachedPod(w, o) {
			t.Errorf("the event of %s is not the cache's pod", o.Name)
		}
		if o.Spec.Containers[0].Image != "" {
			t.Errorf("the event of %s is not stripped: image %q", o.Name, o.Spec.Containers[0].Image)
		}
	}
	epoch := cur.Epoch()

	// relabel changes a pod's label and waits until the cache has handed
	// the handlers its update: the version the cache last saw.
	relabel := func(name, v string) string {
		t.Helper()
		var pd corev1.Pod
		must(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pd))
		pd.Labels["v"] = v
		must(t, k8s.Update(ctx, &pd))
		eventually(t, "the update of "+name, func() (bool, string) {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			return slices.Contains(rec.events, "update "+name), fmt.Sprint(rec.events)
		})
		_, objs, olds := rec.take()
		if o := objs[len(objs)-1]; !cachedPod(w, o) || o.Labels["v"] != v || olds[len(olds)-1] == nil {
			t.Fatalf("the update of %s hands %+v (old %v), want the cache's pod with v=%s and the one before", name, o.ObjectMeta, olds[len(olds)-1], v)
		}
		return pd.ResourceVersion
	}

	// 1. A cut watch: resumed at once from the last version, no list.
	rv := relabel("a", "1")
	reqs.requests()
	proxy.SetMode(testenv.ProxyForward) // cuts every open connection
	eventually(t, "the watch to be resumed", func() (bool, string) {
		reqs.mu.Lock()
		defer reqs.mu.Unlock()
		return len(reqs.log) > 0, "no request"
	})
	if got := reqs.requests(); !watchFrom(got[0], rv) {
		t.Fatalf("after the cut the cache requested %v, want to watch from %s (the last version it saw, or a bookmark's after it)", got, rv)
	}
	relabel("a", "2")
	if !cur.Current(epoch) {
		t.Error("a cut watch that was resumed made the cache stale")
	}

	// 2. A watch that cannot be resumed (410) while lists fail: stale;
	// meanwhile a changes, b goes and c comes.
	rv = relabel("a", "3")
	reqs.set(true, true)
	proxy.SetMode(testenv.ProxyForward)
	eventually(t, "the cache to be stale", func() (bool, string) { return !cur.Current(epoch), "current" })
	var a corev1.Pod
	must(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "a"}, &a))
	a.Labels["v"] = "4"
	must(t, k8s.Update(ctx, &a))
	// At once: no kubelet confirms a graceful deletion.
	must(t, k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b"}}, client.GracePeriodSeconds(0)))
	pod(t, ns, "c", lbl, "10.5.0.3", true, 8000)
	if cur.Current(epoch) {
		t.Fatal("current while the cache cannot list")
	}
	if events, _, _ := rec.take(); len(events) > 0 {
		t.Fatalf("a stale cache handed on %v before its relist", events)
	}
	reqs.set(false, false)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := cur.Wait(wctx); err != nil {
		t.Fatalf("not current again 30 s after lists are answered: %v", err)
	}
	// Current only once the handlers have the difference: no polling.
	events, objs, olds := rec.take()
	if len(events) != 3 || events[0] != "delete b" || !slices.Contains(events, "create c") || !slices.Contains(events, "update a") {
		t.Fatalf("the relist handed on %v, want delete b first, then create c and update a", events)
	}
	for i, o := range objs {
		if events[i] != "delete b" && !cachedPod(w, o) {
			t.Errorf("%s: not the cache's pod", events[i])
		}
		if events[i] == "update a" && (olds[i] == nil || olds[i].Labels["v"] != "3" || o.Labels["v"] != "4") {
			t.Errorf("update a hands old %v new %v, want v=3 then v=4", olds[i], o.Labels)
		}
	}
	var got corev1.Pod
	must(t, r.Get(ctx, client.ObjectKey{Namespace: ns, Name: "a"}, &got))
	if got.Labels["v"] != "4" {
		t.Errorf("a holds v=%s once current, want 4 (changed while stale)", got.Labels["v"])
	}
	if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: "b"}, &got); !apierrors.IsNotFound(err) {
		t.Errorf("b, deleted while stale, is still cached once current (err %v)", err)
	}
	must(t, r.Get(ctx, client.ObjectKey{Namespace: ns, Name: "c"}, &got))
	log := reqs.requests()
	if len(log) < 3 || !watchFrom(log[0], rv) || !slices.Contains(log, "list ") {
		t.Fatalf("requests %v, want the watch from %s (410), then lists (a consistent read) until one is answered", log, rv)
	}
	if cur.Current(epoch) {
		t.Error("Current(epoch) of before the cut is true")
	}
	// Watching again, from the list's version.
	relabel("c", "1")

	// 3. A stale cache that stops (no route reads it any more) is
	// forgotten: the controller is current again.
	reqs.set(true, true)
	proxy.SetMode(testenv.ProxyForward)
	eventually(t, "the cache to be stale", func() (bool, string) { return !cur.Current(cur.Epoch()), "current" })
	stopPodCaches(p)
	eventually(t, "the stopped cache to be forgotten", func() (bool, string) { return cur.Current(cur.Epoch()), "stale" })
}

// cachedPod says whether pod is what cache w holds of it now.
func cachedPod(w *podWatcher, pod *corev1.Pod) bool {
	w.mu.RLock()
	stored := w.pods[pod.Name]
	w.mu.RUnlock()
	return stored != nil && reflect.DeepEqual(pod, stored.Pod())
}
