package compiler

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/peers"
)

// TestNginxDynamicStateNeverEvictsTable: peer state never evicts the
// stored peers table. A route with a 64k dict, a table of 300 peers (every
// one reaching the same backend through its own loopback address) and
// 1,500 requests spread over them: without the engine's non-evicting
// writes the per-peer keys pushed the table and its serial out (GET
// /peers/<route> showed serial 0, requests answered 503 "has no peer" and
// the 409 ordering guard was lost). The table, its serial and the ordering
// survive the requests, a SIGHUP and a worker killed and respawned; the
// state writes the dict had no room for are counted.
func TestNginxDynamicStateNeverEvictsTable(t *testing.T) {
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	srv := &http.Server{Handler: text("ok")}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	n := startDynamic(t)
	installDynamic(t, n, "tiny", dynamicLLMConf(t, n, llmRoute("tiny", map[string]string{SharedDictSizeKey: "64k"}, backendTier)))
	c := controlClient(n)
	var list []peers.Peer
	for i := 0; i < 300; i++ {
		list = append(list, peers.Peer{Host: fmt.Sprintf("127.0.%d.%d", i/250+1, i%250+1), Port: int32(port)})
	}
	tb, body := table(t, "tiny", backendPeers(list...))
	push(t, c, tb, body, 7)

	held := func(step string) {
		t.Helper()
		code, a, raw := control(t, c, "GET", "/peers/tiny", nil, -1, nil)
		if code != 200 || a.Version != tb.Version || a.Serial != 7 || a.Peers != 300 {
			t.Fatalf("%s: GET /peers/tiny %d %s, want version %s, serial 7, 300 peers", step, code, raw, tb.Version)
		}
		if code, _, raw := control(t, c, "PUT", "/peers/tiny", body, 6, nil); code != 409 {
			t.Fatalf("%s: a lower serial: %d %s, want 409 (the ordering guard)", step, code, raw)
		}
	}
	requests := func(step string, count int) {
		t.Helper()
		client := &http.Client{Timeout: 10 * time.Second}
		defer client.CloseIdleConnections()
		failed := 0
		for i := 0; i < count; i++ {
			req, _ := http.NewRequest("POST", n.URL("tiny")+"v1/chat/completions", strings.NewReader(`{}`))
			req.Header.Set("X-Session-Id", fmt.Sprintf("%s-%d", step, i))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b := readAll(t, resp)
			if resp.StatusCode != 200 {
				failed++
				if failed <= 3 {
					t.Logf("%s: request %d: %d %q", step, i, resp.StatusCode, b)
				}
			}
		}
		if failed != 0 {
			t.Errorf("%s: %d of %d requests failed", step, failed, count)
		}
		held(step)
	}
	requests("requests", 1500)
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	requests("after a SIGHUP", 300)
	workers := n.WorkerPIDs()
	if err := syscall.Kill(workers[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for now := n.WorkerPIDs(); len(now) < len(workers) || slices.Contains(now, workers[0]); now = n.WorkerPIDs() {
		if time.Now().After(deadline) {
			t.Fatalf("no worker respawned after SIGKILL of %d: %v", workers[0], n.WorkerPIDs())
		}
		time.Sleep(20 * time.Millisecond)
	}
	requests("after a worker respawned", 300)
	fams := scrape(t, n)
	t.Logf("state writes the 64k dict had no room for: %v", sum(fams, "autoconfig_engine_state_write_failures_total", map[string]string{"route": "tiny"}))
}
