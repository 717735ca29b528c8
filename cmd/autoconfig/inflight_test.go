package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// sockets counts this process's open sockets.
func sockets(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// TestManagerConfigOneConnection: the controller's clients send a cold
// start's burst of parallel requests over the connection they have. 500
// parallel patches through a plain client-go config opened hundreds of
// TLS connections to the API server (a new one for each request beyond the
// HTTP/2 streams of the open one) — most of the controller's memory peak
// at start, and handshakes on both sides; through managerConfig at most
// DefaultMaxInFlight are in flight and a few connections suffice. Watches
// hold no slot: more open watches than slots (on their own connection, as
// the pod caches') do not stop the requests.
func TestManagerConfigOneConnection(t *testing.T) {
	sc := startCluster(t)
	o, err := parseControllerFlags(t)
	if err != nil {
		t.Fatal(err)
	}
	o.kubeconfig = sc.adminKubeconfig
	cfg, err := o.restConfig()
	if err != nil {
		t.Fatal(err)
	}
	mc := managerConfig(cfg)
	cs, err := kubernetes.NewForConfig(mc)
	if err != nil {
		t.Fatal(err)
	}
	// The watches' client shares the bound (the same config) but not the
	// connection, as the controller's pod caches.
	wc := rest.CopyConfig(mc)
	wc.DisableCompression = true // another transport (client-go shares one per TLS and compression setting)
	ws, err := kubernetes.NewForConfig(wc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n = 500
	cms := cs.CoreV1().ConfigMaps("default")
	for i := range n {
		if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("cm-", i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// More watches than request slots, open throughout.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	for i := range DefaultMaxInFlight + 8 {
		w, err := ws.CoreV1().ConfigMaps("default").Watch(wctx, metav1.ListOptions{FieldSelector: "metadata.name=cm-" + fmt.Sprint(i)})
		if err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
		defer w.Stop()
	}
	before := sockets(t)
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak.Store(max(peak.Load(), int64(sockets(t))))
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if _, err := cms.Patch(ctx, fmt.Sprint("cm-", i), types.MergePatchType, []byte(`{"data":{"a":"b"}}`), metav1.PatchOptions{}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	close(stop)
	<-sampled
	t.Logf("%d parallel patches: sockets %d before, at most %d during", n, before, peak.Load())
	if extra := peak.Load() - int64(before); extra > 8 {
		t.Errorf("%d parallel patches opened up to %d more sockets, want a few at most", n, extra)
	}
	// Every patch went through.
	for i := range n {
		cm, err := cms.Get(ctx, fmt.Sprint("cm-", i), metav1.GetOptions{})
		if err != nil || cm.Data["a"] != "b" {
			t.Fatalf("cm-%d: %v %v", i, cm.Data, err)
		}
	}
}
