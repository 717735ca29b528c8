package compiler

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
)

// The pushed-table property: every peers table pushed to the engine's
// control socket is either served or refused — never accepted and then
// answered 500 (a host the balancer cannot dial, a number it cannot use).
// TestPropertyPushedTables pushes AUTOCONFIG_PROPERTY_N/3 (default 50)
// random tables from seed AUTOCONFIG_PROPERTY_SEED into a real engine;
// FuzzPushedTable lets the fuzzer choose them (make fuzz-push).

// hostileHosts are hosts a hand-edited ConfigMap or a local push might
// carry; the ones the balancer can dial reach the rig's backend.
var dialable = []string{"127.0.0.1", "127.0.0.2", "127.1.2.3", "::1", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1"}

var hostileHosts = []string{
	"example.com", "localhost", "127.0.0.1:18001", "127.0.0.1 ", " 127.0.0.1", "[::1]", "fe80::1%lo", "127.0.0.256", "127.0.0",
	"127.000.0.1", "1.2.3.4.5", "::1::", ":::", "", "\x00", "127.0.0.1\n", "🙂", "0x7f.0.0.1", "2130706433",
}

// genTable is a random peers table of route (format 1 or 2) as JSON: its
// peers on port (where a listener answers every loopback address) or a
// random port, with hosts, ports, tier fields and split names drawn from
// valid and hostile values.
func genTable(r *rand.Rand, route string, port int) []byte {
	peer := func() map[string]any {
		p := map[string]any{"host": dialable[r.IntN(len(dialable))], "port": port}
		if r.IntN(6) == 0 {
			p["host"] = hostileHosts[r.IntN(len(hostileHosts))]
		}
		switch r.IntN(24) {
		case 0:
			p["port"] = r.IntN(70000) - 2000
		case 1:
			p["port"] = float64(port) + 0.5
		case 2:
			p["port"] = fmt.Sprint(port)
		case 3:
			p["host"] = randString(r, 12)
		}
		return p
	}
	tier := func(use string) map[string]any {
		var ps []any
		for range r.IntN(4) {
			ps = append(ps, peer())
		}
		tr := map[string]any{"use": use, "priority": r.IntN(5) - 1, "peers": ps}
		if ps == nil {
			tr["peers"] = []any{}
		}
		switch r.IntN(12) {
		case 0:
			tr["max_concurrency"] = r.IntN(5) - 1
		case 1:
			tr["probe_path"] = pick(r, "/health", "", "/x y")
		case 2:
			tr["use"] = pick(r, "backend", "")
		}
		return tr
	}
	t := map[string]any{"format": 1, "route": route, "version": fmt.Sprintf("v%d", r.Uint64()), "tiers": []any{tier("backend"), tier("backend-svc")}}
	if r.IntN(3) == 0 {
		t["format"] = 2
		c := map[string]any{"weight": r.IntN(110), "tiers": []any{tier("canary")}}
		for _, k := range []string{"sticky_header", "override_header", "sticky_cookie"} {
			if r.IntN(2) == 0 {
				c[k] = pick(r, "x-session-id", "x-model-version", "autoconfig-session")
			}
		}
		t["canary"] = c
	}
	b, _ := json.Marshal(t)
	return b
}

// pushRig is a real engine with one dynamic llm route and a backend that
// answers on every loopback address.
type pushRig struct {
	n      *nginxtest.Nginx
	c      *http.Client
	port   int
	serial int64
}

func newPushRig(t testing.TB) *pushRig {
	t.Helper()
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) })}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	n := startDynamic(t)
	installDynamic(t, n, "prop", dynamicLLMConf(t, n, llmRoute("prop", map[string]string{"retry_on": "connect-failure", "max_tries": "3"}, backendTier)))
	return &pushRig{n: n, c: controlClient(n), port: l.Addr().(*net.TCPAddr).Port}
}

// check pushes one table; when the engine accepts it, requests through
// the route must not answer 500. It returns whether the table was taken.
func (p *pushRig) check(t testing.TB, body []byte) bool {
	t.Helper()
	p.serial++
	code, _, raw := control(t, p.c, "PUT", "/peers/prop", body, p.serial, nil)
	switch code {
	case 200:
	case 400:
		return false
	default:
		t.Fatalf("push: %d %s (want 200 or 400)\ntable: %s", code, raw, body)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 4 {
		req, _ := http.NewRequest("POST", p.n.URL("prop")+"v1/chat/completions", strings.NewReader(`{"messages":[{"role":"user","content":"q"}]}`))
		req.Header.Set("X-Session-Id", fmt.Sprint(i))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 500 {
			t.Fatalf("an accepted table answers 500: %q\ntable: %s\nerror log:\n%s", b, body, tail(p.n.ErrorLog(), 2000))
		}
	}
	return true
}

func TestPropertyPushedTables(t *testing.T) {
	p := newPushRig(t)
	want := propertyEnv("AUTOCONFIG_PROPERTY_N", 150) / 3
	seed := uint64(propertyEnv("AUTOCONFIG_PROPERTY_SEED", 1))
	r := rand.New(rand.NewPCG(seed, 1))
	taken := 0
	for range want {
		if p.check(t, genTable(r, "prop", p.port)) {
			taken++
		}
	}
	t.Logf("seed %d: %d random tables pushed, %d taken and served without a 500, %d refused with 400", seed, want, taken, want-taken)
	if taken == 0 || taken == want {
		t.Errorf("%d of %d tables taken: the generator should make both kinds", taken, want)
	}
}

// FuzzPushedTable: the fuzzer chooses the generator's random stream;
// every table is refused or served without a 500 (make fuzz-push).
func FuzzPushedTable(f *testing.F) {
	for _, s := range []uint64{1, 2, 3, 42} {
		f.Add(s, s*7919)
	}
	p := newPushRig(f)
	f.Fuzz(func(t *testing.T, a, b uint64) {
		r := rand.New(rand.NewPCG(a, b))
		for range 4 {
			p.check(t, genTable(r, "prop", p.port))
		}
	})
}
