package main

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelsphere/autoconfig/hack/scale/procmem"
)

// The benchmark itself runs for minutes (make bench-scale); these tests
// cover its bookkeeping without a control plane.

func TestLayoutSplitsPodsOverRoutes(t *testing.T) {
	for _, c := range []struct{ pods, routes int }{{10000, 100}, {10000, 1000}, {400, 20}, {1003, 10}, {7, 7}, {10, 3}} {
		l := layout{pods: c.pods, routes: c.routes, rolloutPct: 10}
		next, changed := 0, 0
		for r := 0; r < c.routes; r++ {
			start, end := l.podRange(r)
			if start != next || end <= start {
				t.Fatalf("%d pods / %d routes: route %d has [%d, %d), want to start at %d and hold a pod", c.pods, c.routes, r, start, end, next)
			}
			for i := start; i < end; i++ {
				if got := l.routeOf(i); got != r {
					t.Fatalf("%d pods / %d routes: routeOf(%d) = %d, want %d", c.pods, c.routes, i, got, r)
				}
				if l.changed(i - start) {
					changed++
				}
			}
			next = end
		}
		if next != c.pods {
			t.Fatalf("%d pods / %d routes: routes hold %d pods", c.pods, c.routes, next)
		}
		if c.pods == 10000 && changed != 1000 {
			t.Errorf("%d pods / %d routes: the rollout changes %d pods, want 1000", c.pods, c.routes, changed)
		}
	}
}

func TestPodIPsAreDistinctAndOutsideTheServiceRange(t *testing.T) {
	svc := netip.MustParsePrefix(serviceCIDR)
	seen := map[string]bool{}
	for gen := 0; gen < 2; gen++ {
		for _, i := range []int{0, 1, 253, 254, 255, 65023, 65024, 9999, maxPods - 1} {
			ip := podIP(gen, i)
			a, err := netip.ParseAddr(ip)
			if err != nil || svc.Contains(a) || strings.HasSuffix(ip, ".0") || strings.HasSuffix(ip, ".255") {
				t.Errorf("podIP(%d, %d) = %s: not a usable pod address", gen, i, ip)
			}
			if seen[ip] {
				t.Errorf("podIP(%d, %d) = %s twice", gen, i, ip)
			}
			seen[ip] = true
		}
	}
	distinct := map[string]bool{}
	for i := 0; i < 70000; i++ {
		ip := podIP(0, i)
		if distinct[ip] {
			t.Fatalf("podIP(0, %d) = %s repeats", i, ip)
		}
		distinct[ip] = true
	}
}

func TestParseMatrix(t *testing.T) {
	got, err := parseMatrix(DefaultMatrix)
	if err != nil || len(got) != 3 || got[1] != (shape{1000, 10}) || got[2] != (shape{1000, 100}) {
		t.Fatalf("parseMatrix(%q) = %v, %v", DefaultMatrix, got, err)
	}
	for _, bad := range []string{"", "100", "100x", "x10", "0x10", "100x10,a"} {
		if _, err := parseMatrix(bad); err == nil {
			t.Errorf("parseMatrix(%q) accepted", bad)
		}
	}
}

// TestNeedlesMatchTheCompiler: the form the convergence check looks for is
// the one the compiler renders, for both model types.
func TestNeedlesMatchTheCompiler(t *testing.T) {
	for _, mt := range []string{"llm", "video"} {
		if err := checkNeedles(mt); err != nil {
			t.Errorf("%s: %v", mt, err)
		}
	}
}

func TestCheckCM(t *testing.T) {
	l := layout{routes: 2, cms: 1, pods: 4, nodes: 1, nss: 1, sliceSize: 100, rolloutPct: 50, modelType: "video"}
	w := &world{l: l, gen: make([]int, l.pods)}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: cmNamespace, Name: l.cmName(0)}, Data: map[string]string{baseKey: "x"}}
	file := func(gens ...int) string {
		var b strings.Builder
		for i, g := range gens {
			b.WriteString("    " + needle("video", podIP(g, i), backendPort) + "max_fails=3;\n")
		}
		return b.String()
	}
	if ok, p, err := checkCM(cm, w.expectations()[0]); ok || err != nil || !strings.Contains(p, "has no key") {
		t.Fatalf("empty ConfigMap: ok=%v problem=%q err=%v", ok, p, err)
	}
	cm.Data[l.routeKey(0)] = file(0, 0)
	cm.Data[l.routeKey(1)] = file(0, 0, 0, 0)[len(file(0, 0)):] // pods 2 and 3
	if ok, p, err := checkCM(cm, w.expectations()[0]); !ok || err != nil {
		t.Fatalf("complete ConfigMap: ok=%v problem=%q err=%v", ok, p, err)
	}
	w.gen[1], w.gen[3] = 1, 1 // the rollout moves pods 1 and 3
	if ok, p, _ := checkCM(cm, w.expectations()[0]); ok || !strings.Contains(p, "lacks") {
		t.Fatalf("old addresses passed as new: ok=%v problem=%q", ok, p)
	}
	cm.Data[l.routeKey(0)] = file(0, 0) + file(0, 1)
	cm.Data[l.routeKey(1)] = file(0, 0, 0, 1)[len(file(0, 0)):]
	if ok, p, _ := checkCM(cm, w.expectations()[0]); ok || !strings.Contains(p, "still has") {
		t.Fatalf("a stale address passed: ok=%v problem=%q", ok, p)
	}
	cm.Data[l.routeKey(0)] = file(0, 1)
	if ok, p, err := checkCM(cm, w.expectations()[0]); !ok || err != nil {
		t.Fatalf("rolled-out ConfigMap: ok=%v problem=%q err=%v", ok, p, err)
	}
	delete(cm.Data, baseKey)
	if _, _, err := checkCM(cm, w.expectations()[0]); err == nil {
		t.Fatal("a lost base key is not an error")
	}
}

func TestProcReaders(t *testing.T) {
	rss, hwm, err := procmem.Read(os.Getpid())
	if err != nil || rss <= 0 || hwm < rss {
		t.Fatalf("procMem = %d, %d, %v", rss, hwm, err)
	}
	if cpu, err := procCPU(os.Getpid()); err != nil || cpu < 0 {
		t.Fatalf("procCPU = %v, %v", cpu, err)
	}
}

func TestSpreadOf(t *testing.T) {
	s := spreadOf(map[string]int{"a": 3, "b": 1}, []string{"a", "b", "c"})
	if s != (spread{Min: 0, Mean: 4.0 / 3, Max: 3, Total: 4}) {
		t.Fatalf("spreadOf = %+v", s)
	}
}

func TestSpreadRoutesCoversConfigMapsAndNamespaces(t *testing.T) {
	for _, c := range []struct{ n, k, cms, nss int }{{100, 10, 10, 10}, {1000, 10, 100, 10}, {1000, 10, 10, 10}, {20, 10, 4, 10}, {10, 10, 10, 10}} {
		got := spreadRoutes(c.n, c.k)
		seen, cms, nss := map[int]bool{}, map[int]bool{}, map[int]bool{}
		for _, r := range got {
			if r < 0 || r >= c.n || seen[r] {
				t.Fatalf("spreadRoutes(%d, %d) = %v: %d out of range or twice", c.n, c.k, got, r)
			}
			seen[r], cms[r%c.cms], nss[r%c.nss] = true, true, true
		}
		if len(got) != c.k || len(cms) != min(c.k, c.cms) || len(nss) != min(c.k, c.nss) {
			t.Errorf("spreadRoutes(%d, %d) = %v: %d ConfigMaps of %d, %d namespaces of %d", c.n, c.k, got, len(cms), c.cms, len(nss), c.nss)
		}
	}
}

func TestSelectorRoutesSpreadOverNamespaces(t *testing.T) {
	l := layout{routes: 1000, cms: 10, nss: 10, selRoutes: selectorRoutes(0.1, 1000)}
	if l.selRoutes != 100 || !l.selector(0) || !l.selector(99) || l.selector(100) {
		t.Fatalf("selRoutes %d: want routes 0-99", l.selRoutes)
	}
	if got := l.selectorNamespaces(); len(got) != 10 {
		t.Errorf("selector namespaces %v, want all 10", got)
	}
	if rt := route(l, 5); rt.Spec.Discovery.Service != "" || rt.Spec.Discovery.Selector != l.selectorOf(5) {
		t.Errorf("route 5 discovery %+v, want the selector %s", rt.Spec.Discovery, l.selectorOf(5))
	}
	if rt := route(l, 500); rt.Spec.Discovery.Service != l.routeName(500) || rt.Spec.Discovery.Selector != "" {
		t.Errorf("route 500 discovery %+v, want the Service", rt.Spec.Discovery)
	}
	if got := selectorRoutes(1, 7); got != 7 {
		t.Errorf("selectorRoutes(1, 7) = %d", got)
	}
}
