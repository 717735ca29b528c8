package controller

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// configMapBytes counts the response bytes of the ConfigMap requests (list,
// watch, get) a client receives.
type configMapBytes struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c configMapBytes) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(req)
	if err == nil && strings.Contains(req.URL.Path, "/configmaps") {
		resp.Body = &countingBody{ReadCloser: resp.Body, n: c.n}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// TestUnreferencedConfigMapsAreNotReceived: the controller watches
// ConfigMaps as metadata only, so a large ConfigMap no route references
// costs it a few hundred bytes per change, not its content (it used to
// cache, and receive on every change, every ConfigMap in full: here 5 ×
// 512 KiB). A referenced ConfigMap still works: a hand edit of the route's
// key, made after those changes (so the watch has delivered them when the
// controller sees it), is repaired.
func TestUnreferencedConfigMapsAreNotReceived(t *testing.T) {
	var received atomic.Int64
	cfg := rest.CopyConfig(testCfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return configMapBytes{rt: rt, n: &received} })
	ctx := context.Background()
	ns := namespace(t, "cmcache")
	h := newHarnessAs(t, cfg, ns)
	t.Cleanup(h.stop)
	service(t, ns, "m", 8000)
	endpointSlice(t, ns, "m-a", "m", v4, 8000, up("10.7.0.1"))
	configMap(t, ns, "routes", map[string]string{"base.conf": "# the consumer's"}, nil)
	createRoute(t, newRoute(ns, "m", "m"))
	waitKey(t, ns, "routes", routeKey("m"), []string{host("10.7.0.1")}, nil)
	before := received.Load()

	big := strings.Repeat("x", 512<<10)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unrelated"}, Data: map[string]string{"blob": big}}
	must(t, k8s.Create(ctx, cm))
	for i := range 4 {
		cm.Data["blob"] = fmt.Sprintf("%d%s", i, big[1:])
		must(t, k8s.Update(ctx, cm))
	}
	routes, err := getCM(t, ns, "routes")
	must(t, err)
	routes.Data[routeKey("m")] += "\n# edited by hand\n" // the owner mark stays: still the route's key
	must(t, k8s.Update(ctx, routes))
	waitKey(t, ns, "routes", routeKey("m"), []string{host("10.7.0.1")}, []string{"edited by hand"})

	if n := received.Load() - before; n > 64<<10 {
		t.Fatalf("the controller received %d KiB of ConfigMaps for 5 versions of an unreferenced 512 KiB ConfigMap and one edit of its own, want metadata only (< 64 KiB)", n>>10)
	} else {
		t.Logf("received %d bytes of ConfigMap responses", n)
	}
}
