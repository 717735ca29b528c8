package informer

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/testenv"
)

// TestCacheCurrencyAfterCut: a cache built with CacheCurrency, cut off
// from the API server while one EndpointSlice changes, one is deleted and
// one created, is not current during the cut; once Wait returns after the
// API server is back, the cache holds all three changes (no polling: Wait
// is the guarantee reconciles rely on), and the OnCurrent callback ran.
func TestCacheCurrencyAfterCut(t *testing.T) {
	ns := namespace(t, "currency")
	endpointSlice(t, ns, "a", "svc", discoveryv1.AddressTypeIPv4, 8000, up("10.9.0.1"))
	endpointSlice(t, ns, "b", "svc", discoveryv1.AddressTypeIPv4, 8000, up("10.9.0.2"))

	proxy := testenv.NewTCPProxy(t, strings.TrimSuffix(strings.TrimPrefix(testCfg.Host, "https://"), "/"), testenv.ProxyForward)
	cfg := rest.CopyConfig(testCfg)
	cfg.Host = "https://" + proxy.Addr()
	cur := NewCacheCurrency()
	var currentAgain atomic.Int32
	cur.OnCurrent(func() { currentAgain.Add(1) })
	c, err := cache.New(cfg, cur.CacheOptions(cache.Options{Scheme: testScheme, DefaultNamespaces: map[string]cache.Config{ns: {}}}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := c.GetInformer(ctx, &discoveryv1.EndpointSlice{}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	epoch := cur.Epoch()
	if !cur.Current(epoch) {
		t.Fatal("a synced cache is not current")
	}

	proxy.SetMode(testenv.ProxyRefuse)
	eventually(t, "the cut is noticed", func() (bool, string) { return !cur.Current(epoch), "still current" })
	// While cut off: a changes, b goes, c comes.
	var a discoveryv1.EndpointSlice
	must(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "a"}, &a))
	a.Endpoints[0].Addresses = []string{"10.9.0.9"}
	must(t, k8s.Update(ctx, &a))
	must(t, k8s.Delete(ctx, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b"}}))
	endpointSlice(t, ns, "c", "svc", discoveryv1.AddressTypeIPv4, 8000, up("10.9.0.3"))
	time.Sleep(time.Second)
	if cur.Current(epoch) {
		t.Fatal("current while cut off")
	}

	proxy.SetMode(testenv.ProxyForward)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := cur.Wait(wctx); err != nil {
		t.Fatalf("not current again 30 s after the cut ended: %v", err)
	}
	var got discoveryv1.EndpointSlice
	must(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "a"}, &got))
	if addr := got.Endpoints[0].Addresses[0]; addr != "10.9.0.9" {
		t.Errorf("a holds %s once current, want 10.9.0.9 (changed during the cut)", addr)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "b"}, &got); !apierrors.IsNotFound(err) {
		t.Errorf("b, deleted during the cut, is still cached once current (err %v)", err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "c"}, &got); err != nil {
		t.Errorf("c, created during the cut, is not cached once current: %v", err)
	}
	eventually(t, "OnCurrent ran", func() (bool, string) { return currentAgain.Load() == 1, "not called" })
	if cur.Current(epoch) {
		t.Error("Current(epoch) of before the cut is true: a reconcile that read before it would write")
	}
	if !cur.Current(cur.Epoch()) {
		t.Error("not current after Wait")
	}
}
