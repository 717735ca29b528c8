package compiler

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/llmsim"
	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// The llm engine's own semantics (docs/lua-contract.md, "Session
// affinity", "Admission", "Token accounting"; docs/metrics.md, "engine")
// on a real nginx running the shipped deploy/openresty/nginx.conf and
// router.lua with two workers, in front of vLLM-like simulated pods
// (internal/llmsim: a prefix cache per pod, a decode capacity shared by
// the pod's streams, OpenAI streaming with usage).

// engineRig is one nginx, a route and its simulated pods.
type engineRig struct {
	n      *nginxtest.Nginx
	route  *Route
	pods   llmsim.Pods
	client *http.Client
}

func newEngineRig(t *testing.T, name string, pods int, cfg llmsim.Config, values map[string]string, slo *routespec.SLO) *engineRig {
	t.Helper()
	ps, err := llmsim.StartPods(pods, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ps.Close() })
	r := llmRoute(name, values, backendTier)
	r.Spec.SLO = slo
	rig := &engineRig{
		n:     nginxtest.Start(t, nginxtest.Options{Reference: true, Workers: 2}),
		route: r, pods: ps,
		client: &http.Client{Timeout: 120 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512}},
	}
	t.Cleanup(rig.client.CloseIdleConnections)
	rig.install(t, ps)
	return rig
}

// install renders the route with pods as its backends and reloads nginx.
func (rig *engineRig) install(t *testing.T, pods llmsim.Pods) {
	t.Helper()
	var eps []Endpoint
	for _, p := range pods {
		eps = append(eps, Endpoint{IP: "127.0.0.1", Port: int32(p.Port()), Ready: true})
	}
	install(t, rig.n, rig.route, Snapshot{Backends: eps})
}

// url is the route's chat completions endpoint through the dispatch.
func (rig *engineRig) url() string {
	return rig.n.URL(RouteName(rig.route)) + "v1/chat/completions"
}

// turnStats is what a run of multi-turn conversations measured.
type turnStats struct {
	turns, later, stayed int
	failed               int
	laterTTFT            []time.Duration
	podOf                map[int]string // conversation → pod of its last turn
}

func (s turnStats) stayShare() float64 {
	if s.later == 0 {
		return 0
	}
	return float64(s.stayed) / float64(s.later)
}

// conversations runs convs conversations of turns turns each, at most
// concurrent at a time; session(i) is the header of conversation i (nil:
// none, the body is the key); system(i) its system prompt.
func (rig *engineRig) conversations(t *testing.T, convs, turns, concurrent int, session func(int) http.Header, system func(int) string) turnStats {
	t.Helper()
	var mu sync.Mutex
	st := turnStats{podOf: map[int]string{}}
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < concurrent; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				conv := &llmsim.Conversation{System: system(i), FirstUser: fmt.Sprintf("conversation %d: the first question, long enough to be worth caching", i), MaxTokens: 8}
				var hdr http.Header
				if session != nil {
					hdr = session(i)
				}
				prev := ""
				for turn := 0; turn < turns; turn++ {
					res := llmsim.Chat(context.Background(), rig.client, rig.url(), conv.Next(fmt.Sprintf("turn %d", turn)), hdr)
					mu.Lock()
					st.turns++
					if res.Err != nil || res.Status != 200 {
						st.failed++
						if st.failed <= 3 {
							t.Logf("conversation %d turn %d: %d %v %q", i, turn, res.Status, res.Err, res.Text)
						}
						mu.Unlock()
						break
					}
					if turn > 0 {
						st.later++
						st.laterTTFT = append(st.laterTTFT, res.TTFT)
						if res.Pod == prev {
							st.stayed++
						}
					}
					st.podOf[i] = res.Pod
					mu.Unlock()
					prev = res.Pod
					conv.Record(res.Text)
				}
			}
		}()
	}
	for i := 0; i < convs; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return st
}

func sessionID(i int) http.Header {
	return http.Header{"X-Session-Id": {"session-" + strconv.Itoa(i)}}
}

func sameSystem(int) string { return "You are a helpful assistant." }

// TestNginxEngineAffinity: 16 concurrent conversations of 5 turns over 8
// pods stay on their pod (≥ 95 % of the turns after the first), keyed by
// the session header or, without one, by the conversation's first
// messages in the body; with affinity off (least load, the engine before
// affinity) about 1 in 8 do.
func TestNginxEngineAffinity(t *testing.T) {
	cfg := llmsim.Config{DecodeTokensPerSecond: 2000}
	for _, tc := range []struct {
		name    string
		values  map[string]string
		session func(int) http.Header
		min     float64
		max     float64
	}{
		{"header", nil, sessionID, 0.95, 1},
		{"body", nil, nil, 0.95, 1},
		{"off", map[string]string{"affinity": "off"}, sessionID, 0, 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rig := newEngineRig(t, "aff-"+tc.name, 8, cfg, tc.values, nil)
			st := rig.conversations(t, 64, 5, 16, tc.session, func(i int) string { return fmt.Sprintf("system prompt %d", i%4) })
			p50 := llmsim.Percentile(st.laterTTFT, 0.5)
			t.Logf("%s: %d turns, %d failed, %.1f %% of later turns on the previous turn's pod, TTFT p50 of later turns %v",
				tc.name, st.turns, st.failed, 100*st.stayShare(), p50)
			if st.failed != 0 {
				t.Errorf("%d turns failed", st.failed)
			}
			if s := st.stayShare(); s < tc.min || s > tc.max {
				t.Errorf("%.3f of later turns stayed, want %.2f..%.2f", s, tc.min, tc.max)
			}
		})
	}
}

// writeFile writes a file or fails the test.
func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

var _ = filepath.Join
