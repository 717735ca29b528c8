package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/testenv"
)

// cmRecorder records every version of one ConfigMap key a watch sees.
type cmRecorder struct {
	mu     sync.Mutex
	values []recordedWrite
}

type recordedWrite struct {
	at    time.Time
	rv    string
	value string
	ok    bool // the key was there
}

// recordConfigMap watches ns/name from now on and records key at every
// change, until the test ends.
func recordConfigMap(t *testing.T, sc *scriptCluster, ns, name, key string) *cmRecorder {
	t.Helper()
	cs, err := kubernetes.NewForConfig(sc.env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &cmRecorder{}
	go func() {
		rv := cm.ResourceVersion
		for ctx.Err() == nil {
			w, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: rv})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				cm, ok := ev.Object.(*corev1.ConfigMap)
				if !ok {
					continue
				}
				rv = cm.ResourceVersion
				if ev.Type != watch.Modified {
					continue
				}
				v, has := cm.Data[key]
				rec.mu.Lock()
				rec.values = append(rec.values, recordedWrite{at: time.Now(), rv: cm.ResourceVersion, value: v, ok: has})
				rec.mu.Unlock()
			}
			w.Stop()
		}
	}()
	return rec
}

func (r *cmRecorder) writes() []recordedWrite {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recordedWrite(nil), r.values...)
}

// setEndpoint makes ip the only endpoint of ns/vid-1.
func setEndpoint(t *testing.T, sc *scriptCluster, ns, ip string) {
	t.Helper()
	var s discoveryv1.EndpointSlice
	ctx := context.Background()
	if err := sc.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vid-1"}, &s); err != nil {
		t.Fatal(err)
	}
	ready := true
	s.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}}
	if err := sc.admin.Update(ctx, &s); err != nil {
		t.Fatal(err)
	}
}

// waitKeyHolds waits until the route's key holds ip.
func waitKeyHolds(t *testing.T, sc *scriptCluster, ns, route, ip string, timeout time.Duration) {
	t.Helper()
	key := "session_route_" + route + ".conf"
	deadline := time.Now().Add(timeout)
	for {
		var cm corev1.ConfigMap
		if err := sc.admin.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "routes"}, &cm); err == nil && strings.Contains(cm.Data[key], ip) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/routes key %s does not hold %s within %v", ns, key, ip, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTakeoverAfterCutWritesNoStaleEndpoints: a standby that was cut off
// from the API server while the endpoints changed, and that takes the
// Lease as soon as the API server is back (the leader released it on
// SIGTERM meanwhile: a rollout during a partition), never writes what its
// cache held before the cut: every write it makes holds the endpoints
// current at the time, and a later change reaches the key. Three rounds,
// the replicas swapping roles (the one handed over from restarts as the
// standby).
//
// Before the caches tracked their currency (internal/informer/
// currency.go), the new leader's initial sync could render the endpoints
// of its stale cache and write them over the newer ones, in the second or
// so before its informers had listed again; whether it did in a round
// depended on which came first.
func TestTakeoverAfterCutWritesNoStaleEndpoints(t *testing.T) {
	sc := startCluster(t)
	const ns = "stale1"
	if err := sc.apply(routeFixture(ns, "r1")); err != nil {
		t.Fatal(err)
	}
	target := kubeconfigTarget(t, sc.adminKubeconfig)
	type replica struct {
		name  string
		proxy *testenv.TCPProxy
		kc    string
		proc  *controllerProc
	}
	args := []string{"--namespace", ns, "--leader-elect", "--leader-election-namespace", ns,
		"--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "200ms"}
	start := func(r *replica, gen int) {
		r.proc = startController(t, fmt.Sprintf("%s%d", r.name, gen), append([]string{"--kubeconfig", r.kc}, args...)...)
	}
	var reps [2]*replica
	for i, name := range []string{"a", "b"} {
		p := testenv.NewTCPProxy(t, target, testenv.ProxyForward)
		kc, _ := proxiedKubeconfig(t, sc.adminKubeconfig, p.Addr())
		reps[i] = &replica{name: name, proxy: p, kc: kc}
	}
	leader, standby := reps[0], reps[1]
	start(leader, 0)
	waitKeyHolds(t, sc, ns, "r1", "10.2.0.1", 60*time.Second)
	start(standby, 0)
	standby.proc.waitReady(60 * time.Second)
	standby.proc.waitLog(`Attempting to acquire leader lease`, 30*time.Second)
	setEndpoint(t, sc, ns, "10.2.0.10")
	waitKeyHolds(t, sc, ns, "r1", "10.2.0.10", 30*time.Second)
	rec := recordConfigMap(t, sc, ns, "routes", "session_route_r1.conf")

	ip := 10
	for round := 1; round <= 3; round++ {
		// The standby is cut off; the endpoints change; the leader
		// writes them.
		standby.proxy.SetMode(testenv.ProxyRefuse)
		before := fmt.Sprintf("10.2.0.%d", ip)
		ip++
		current := fmt.Sprintf("10.2.0.%d", ip)
		setEndpoint(t, sc, ns, current)
		waitKeyHolds(t, sc, ns, "r1", current, 30*time.Second)
		from := len(rec.writes())

		// The leader hands over (SIGTERM releases the Lease) while the
		// standby is away; from here on every write is the standby's.
		if code := leader.proc.stop(); code != 0 {
			t.Errorf("round %d: %s exit %d after SIGTERM, want 0", round, leader.proc.name, code)
		}
		time.Sleep(10 * time.Second)
		back := time.Now()
		standby.proxy.SetMode(testenv.ProxyForward)
		standby.proc.waitLog(`Successfully acquired lease`, 60*time.Second)
		t.Logf("round %d: %s acquired the Lease %.1f s after the API server was back", round, standby.proc.name, time.Since(back).Seconds())

		// It leads: a later change reaches the key.
		ip++
		next := fmt.Sprintf("10.2.0.%d", ip)
		setEndpoint(t, sc, ns, next)
		waitKeyHolds(t, sc, ns, "r1", next, 30*time.Second)
		for _, w := range rec.writes()[from:] {
			t.Logf("round %d: write rv %s at %+.2f s: %s=%v %s=%v %s=%v", round, w.rv, w.at.Sub(back).Seconds(),
				before, strings.Contains(w.value, before), current, strings.Contains(w.value, current), next, strings.Contains(w.value, next))
			if !w.ok || w.value == "" {
				t.Errorf("round %d: write rv %s: the key is missing or empty", round, w.rv)
			}
			if strings.Contains(w.value, before) {
				t.Errorf("round %d: write rv %s at %+.2f s holds %s, the endpoint %s's cache held before the cut (current: %s)",
					round, w.rv, w.at.Sub(back).Seconds(), before, standby.proc.name, current)
			}
		}
		// The replica that handed over returns as the standby.
		start(leader, round)
		leader.proc.waitReady(60 * time.Second)
		leader.proc.waitLog(`Attempting to acquire leader lease`, 30*time.Second)
		leader, standby = standby, leader
	}
	if code := leader.proc.stop(); code != 0 {
		t.Errorf("%s: exit %d after SIGTERM, want 0", leader.proc.name, code)
	}
	if code := standby.proc.stop(); code != 0 {
		t.Errorf("%s: exit %d after SIGTERM, want 0", standby.proc.name, code)
	}
}
