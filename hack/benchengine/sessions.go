package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelsphere/autoconfig/internal/llmsim"
)

// The sessions scenario: multi-turn conversations over 8 simulated pods
// with a prefix cache each, placed by the engine's session affinity
// (consistent hashing with bounded loads) or by least load; then the
// keys that move when a pod leaves the route and come back when it
// returns.

// sessionPods is the pods' performance: a cold 4 KB system prompt
// (~1000 tokens) costs ~250 ms of prefill, a warm turn the 20 ms base.
var sessionPods = llmsim.Config{DecodeTokensPerSecond: 1500, PrefillTokensPerSecond: 4000}

// convsPerGroup conversations share one system prompt.
const convsPerGroup = 4

// systemPromptBytes is the size of a group's system prompt.
const systemPromptBytes = 4096

// sessionVariant is one placement's measurement.
type sessionVariant struct {
	Name          string  `json:"name"`
	Description   string  `json:"description"`
	Conversations int     `json:"conversations"`
	Turns         int     `json:"turns"`
	LaterTurns    int     `json:"later_turns"`
	Stayed        int     `json:"stayed"`
	StayedPct     float64 `json:"stayed_pct"`
	Failed        int     `json:"failed"`
	FirstTTFTP50  float64 `json:"first_turn_ttft_p50_ms"`
	LaterTTFTP50  float64 `json:"later_turns_ttft_p50_ms"`
	LaterTTFTP99  float64 `json:"later_turns_ttft_p99_ms"`
	CachedPct     float64 `json:"prompt_tokens_cached_pct"`
	Seconds       float64 `json:"seconds"`
}

type sessionsResult struct {
	Pods        int              `json:"pods"`
	Concurrency int              `json:"concurrency"`
	Variants    []sessionVariant `json:"variants"`
	Disruption  *disruption      `json:"disruption,omitempty"`
}

// systemPrompt is group g's system prompt, systemPromptBytes long.
func systemPrompt(g int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Group %d. You are the support assistant of product line %d. ", g, g)
	const filler = "Answer briefly, cite the manual section of every claim, and ask before guessing. "
	for b.Len() < systemPromptBytes {
		b.WriteString(filler)
	}
	return b.String()[:systemPromptBytes]
}

func runSessions(g *rig, o *options) (*sessionsResult, error) {
	res := &sessionsResult{Pods: o.SessionPods, Concurrency: o.Concurrency}
	for _, v := range []struct {
		name, desc string
		values     map[string]string
		header     bool
	}{
		{"header", "affinity on, keyed by x-session-id", nil, true},
		{"off", "affinity off (least load), x-session-id sent", map[string]string{"affinity": "off"}, true},
		{"body", "affinity on, keyed by the body (no header)", nil, false},
	} {
		logf("sessions: %s (%s)", v.name, v.desc)
		sv, err := sessionRun(g, o, "sess-"+v.name, v.values, v.header)
		if err != nil {
			return res, fmt.Errorf("sessions %s: %w", v.name, err)
		}
		sv.Name, sv.Description = v.name, v.desc
		res.Variants = append(res.Variants, sv)
	}
	logf("sessions: minimal disruption (%d keys)", o.Keys)
	d, err := runDisruption(g, o)
	if err != nil {
		return res, fmt.Errorf("sessions disruption: %w", err)
	}
	res.Disruption = d
	return res, nil
}

// sessionRun runs o.Conversations conversations of o.TurnsPerConv turns,
// o.Concurrency at a time, through a fresh route over fresh pods.
func sessionRun(g *rig, o *options, name string, values map[string]string, header bool) (sessionVariant, error) {
	var sv sessionVariant
	pods, err := llmsim.StartPods(o.SessionPods, sessionPods)
	if err != nil {
		return sv, err
	}
	defer pods.Close()
	route := llmRoute(name, values, nil)
	if err := g.install(route, podEndpoints(pods)); err != nil {
		return sv, err
	}
	defer g.removeRoute(route)
	client := newClient(4 * o.Concurrency)
	defer client.CloseIdleConnections()
	url := g.chatURL(route)

	var mu sync.Mutex
	var firstTTFT, laterTTFT []time.Duration
	var firstErr error
	jobs := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				conv := &llmsim.Conversation{
					System:    systemPrompt(i / convsPerGroup),
					FirstUser: fmt.Sprintf("conversation %d: the first question, long enough to be worth caching", i),
					MaxTokens: 8,
				}
				var hdr http.Header
				if header {
					hdr = http.Header{"X-Session-Id": {"session-" + strconv.Itoa(i)}}
				}
				prev := ""
				for turn := range o.TurnsPerConv {
					r := llmsim.Chat(context.Background(), client, url, conv.Next(fmt.Sprintf("turn %d: and what about this?", turn)), hdr)
					mu.Lock()
					sv.Turns++
					if r.Err != nil || r.Status != http.StatusOK {
						sv.Failed++
						if firstErr == nil {
							firstErr = fmt.Errorf("conversation %d turn %d: status %d: %v", i, turn, r.Status, r.Err)
						}
						mu.Unlock()
						break
					}
					if turn == 0 {
						firstTTFT = append(firstTTFT, r.TTFT)
					} else {
						sv.LaterTurns++
						laterTTFT = append(laterTTFT, r.TTFT)
						if r.Pod == prev {
							sv.Stayed++
						}
					}
					mu.Unlock()
					prev = r.Pod
					conv.Record(r.Text)
				}
			}
		}()
	}
	for i := range o.Conversations {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	sv.Seconds = time.Since(start).Seconds()
	sv.Conversations = o.Conversations
	if sv.LaterTurns > 0 {
		sv.StayedPct = pct(sv.Stayed, sv.LaterTurns)
	}
	sv.FirstTTFTP50 = ms(llmsim.Percentile(firstTTFT, 0.5))
	sv.LaterTTFTP50 = ms(llmsim.Percentile(laterTTFT, 0.5))
	sv.LaterTTFTP99 = ms(llmsim.Percentile(laterTTFT, 0.99))
	var hit, prefill int
	for _, s := range pods.Stats() {
		hit += s.CacheHitTokens
		prefill += s.PrefillTokens
	}
	if hit+prefill > 0 {
		sv.CachedPct = pct(hit, hit+prefill)
	}
	if firstErr != nil {
		logf("sessions %s: %d turns failed, the first: %v", name, sv.Failed, firstErr)
	}
	return sv, nil
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
