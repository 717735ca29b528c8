package llmsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/modelsphere/autoconfig/internal/testbin"
)

func startPods(t *testing.T, n int, cfg Config) Pods {
	t.Helper()
	ps, err := StartPods(n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ps.Close(); err != nil {
			t.Error(err)
		}
	})
	return ps
}

// text is a string of n bytes that starts with seed, so two texts with
// different seeds share no prefix.
func text(seed string, n int) string {
	return (seed + " " + strings.Repeat("x", n))[:n]
}

// answerText is the deterministic answer of n tokens.
func answerText(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(tokenText(i))
	}
	return b.String()
}

func mustChat(t *testing.T, url string, req ChatRequest) Result {
	t.Helper()
	res := Chat(context.Background(), nil, url, req, nil)
	if res.Err != nil {
		t.Fatalf("chat: %v", res.Err)
	}
	return res
}

func within(got, want time.Duration, lo, hi float64) bool {
	return float64(got) >= lo*float64(want) && float64(got) <= hi*float64(want)
}

// timing runs measure up to three times, until it finds no problem with
// the timing it measured, and fails the test with every attempt's
// problems when none passes. The timing holds on a quiet machine, but a
// busy one (the race run shares its CPUs with other packages' tests)
// can stall any single attempt. measure's attempt number lets it use
// fresh prompts, which no earlier attempt cached.
func timing(t *testing.T, measure func(attempt int) []string) {
	t.Helper()
	var all []string
	for attempt := range 3 {
		problems := measure(attempt)
		if len(problems) == 0 {
			return
		}
		for _, p := range problems {
			all = append(all, fmt.Sprintf("attempt %d: %s", attempt+1, p))
		}
	}
	t.Error(strings.Join(all, "\n"))
}

func TestTTFTGrowsWithUncachedPrompt(t *testing.T) {
	ps := startPods(t, 1, Config{PrefillTokensPerSecond: 10000, DecodeTokensPerSecond: 1000})
	user := func(content string) ChatRequest {
		return ChatRequest{Messages: []Message{{Role: "user", Content: content}}, MaxTokens: 2, Stream: true}
	}
	timing(t, func(attempt int) (problems []string) {
		ps.Reset()
		short := mustChat(t, ps[0].URL(), user(text(fmt.Sprint("short", attempt), 40))) // 10 tokens: 1 ms of prefill
		long := mustChat(t, ps[0].URL(), user(text(fmt.Sprint("long", attempt), 8000))) // 2000 tokens: 200 ms of prefill
		t.Logf("TTFT: short prompt %v, long prompt %v", short.TTFT, long.TTFT)
		if long.PromptTokens != 2000 || long.CachedTokens != 0 {
			t.Errorf("long prompt usage: %d prompt tokens, %d cached; want 2000 and 0", long.PromptTokens, long.CachedTokens)
		}
		if s := ps[0].Stats(); s.PrefillTokens != 2010 || s.CacheHitTokens != 0 || s.Requests != 2 {
			t.Errorf("stats %+v, want 2 requests, 2010 prefill tokens, no hit", s)
		}
		if short.TTFT < 20*time.Millisecond || short.TTFT > 80*time.Millisecond {
			problems = append(problems, fmt.Sprintf("short prompt TTFT %v, want about BaseTTFT (20ms) + 1ms", short.TTFT))
		}
		if d := long.TTFT - short.TTFT; !within(d, 199*time.Millisecond, 0.9, 1.5) {
			problems = append(problems, fmt.Sprintf("long TTFT %v - short TTFT %v = %v, want about the 199ms of prefill of 1990 more tokens", long.TTFT, short.TTFT, d))
		}
		return problems
	})
}

func TestNextTurnHitsTheCacheOnlyOnThePodThatServedTheLastOne(t *testing.T) {
	ps := startPods(t, 2, Config{PrefillTokensPerSecond: 10000, DecodeTokensPerSecond: 1000})
	timing(t, func(attempt int) (problems []string) {
		ps.Reset()
		conv := Conversation{System: text(fmt.Sprint("system", attempt), 8000), MaxTokens: 8} // 2000 tokens of system prompt
		first := mustChat(t, ps[0].URL(), conv.Next("what is a pod?"))
		if first.Pod != "pod-0" || first.Text != answerText(8) || first.CachedTokens != 0 {
			t.Fatalf("first turn: pod %q, text %q, %d cached tokens; want pod-0, %q, none", first.Pod, first.Text, first.CachedTokens, answerText(8))
		}
		conv.Record(first.Text)
		req := conv.Next("and a peer?")
		newUser := tokenCount("and a peer?")
		before := ps[0].Stats()

		same := mustChat(t, ps[0].URL(), req)
		if want := same.PromptTokens - newUser; same.CachedTokens != want {
			t.Errorf("second turn on the same pod: %d cached tokens of %d, want %d (all but the new user message)", same.CachedTokens, same.PromptTokens, want)
		}
		if h := same.Header.Get("X-Sim-Cached-Tokens"); h != fmt.Sprint(same.CachedTokens) {
			t.Errorf("X-Sim-Cached-Tokens %q, want %d", h, same.CachedTokens)
		}
		after := ps[0].Stats()
		if d := after.CacheHitTokens - before.CacheHitTokens; d != same.CachedTokens {
			t.Errorf("CacheHitTokens grew by %d, want %d", d, same.CachedTokens)
		}
		if d := after.PrefillTokens - before.PrefillTokens; d != newUser {
			t.Errorf("PrefillTokens grew by %d, want %d (the new user message)", d, newUser)
		}

		other := mustChat(t, ps[1].URL(), req)
		if other.Pod != "pod-1" || other.CachedTokens != 0 {
			t.Errorf("second turn on the other pod: pod %q, %d cached tokens; want pod-1 and none", other.Pod, other.CachedTokens)
		}
		if s := ps[1].Stats(); s.CacheHitTokens != 0 || s.PrefillTokens != other.PromptTokens {
			t.Errorf("other pod stats %+v, want no hit and %d prefill tokens", s, other.PromptTokens)
		}

		t.Logf("TTFT: first turn %v; second turn on the same pod %v, on the other %v", first.TTFT, same.TTFT, other.TTFT)
		if first.TTFT < 200*time.Millisecond {
			problems = append(problems, fmt.Sprintf("first turn TTFT %v, want at least the 200ms of cold prefill", first.TTFT))
		}
		if same.TTFT > 80*time.Millisecond {
			problems = append(problems, fmt.Sprintf("second turn on the same pod: TTFT %v, want about BaseTTFT (20ms)", same.TTFT))
		}
		if other.TTFT < 200*time.Millisecond {
			problems = append(problems, fmt.Sprintf("second turn on the other pod: TTFT %v, want at least the 200ms of cold prefill", other.TTFT))
		}
		return problems
	})
}

func TestDecodeCapacityIsShared(t *testing.T) {
	const capacity, n = 500, 100
	ps := startPods(t, 1, Config{DecodeTokensPerSecond: capacity})
	req := ChatRequest{Messages: []Message{{Role: "user", Content: "hello"}}, MaxTokens: n, Stream: true}
	rateProblem := func(what string, r Result, want float64) []string {
		if r.DecodeRate < 0.75*want || r.DecodeRate > 1.25*want {
			return []string{fmt.Sprintf("%s: %.0f tokens/s, want %.0f ± 25%%", what, r.DecodeRate, want)}
		}
		return nil
	}
	timing(t, func(int) []string {
		alone := mustChat(t, ps[0].URL(), req)
		t.Logf("one stream: %.0f tokens/s", alone.DecodeRate)
		if alone.Tokens != n {
			t.Errorf("one stream: %d tokens, want %d", alone.Tokens, n)
		}
		return rateProblem("one stream", alone, capacity)
	})
	timing(t, func(int) (problems []string) {
		ps.Reset()
		var wg sync.WaitGroup
		results := make([]Result, 4)
		for i := range results {
			wg.Go(func() { results[i] = Chat(context.Background(), nil, ps[0].URL(), req, nil) })
		}
		wg.Wait()
		for i, r := range results {
			if r.Err != nil || r.Tokens != n {
				t.Fatalf("stream %d: %d tokens, error %v", i, r.Tokens, r.Err)
			}
			t.Logf("stream %d of 4: %.0f tokens/s", i, r.DecodeRate)
			problems = append(problems, rateProblem(fmt.Sprintf("stream %d of 4", i), r, capacity/4.0)...)
		}
		if s := ps[0].Stats(); s.MaxActive != 4 || s.Active != 0 || s.DecodedTokens != 4*n {
			t.Errorf("stats %+v, want MaxActive 4, Active 0, %d decoded tokens", s, 4*n)
		}
		return problems
	})
}

var (
	idNumber = regexp.MustCompile(`"id":"chatcmpl-pod-0-[0-9]+"`)
	created  = regexp.MustCompile(`"created":[0-9]+`)
)

// rawEvents posts body to url and returns the data of every event of
// the streamed answer.
func rawEvents(t *testing.T, url, body string) (*http.Response, []string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := newSSEReader(resp.Body)
	var events []string
	for {
		data, err := r.next()
		if errors.Is(err, io.EOF) {
			return resp, events
		}
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, data)
	}
}

func TestChatStreamEvents(t *testing.T) {
	ps := startPods(t, 1, Config{DecodeTokensPerSecond: 2000})
	url := ps[0].URL() + "/v1/chat/completions"
	for _, usage := range []bool{false, true} {
		// A different prompt each time, so neither is cached.
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"%v"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":%v}}`, usage, usage)
		resp, events := rawEvents(t, url, body)
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Errorf("Content-Type %q", ct)
		}
		want := []string{
			`{"id":"chatcmpl-pod-0-N","object":"chat.completion.chunk","created":T,"model":"m","system_fingerprint":"pod-0","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}`,
			`{"id":"chatcmpl-pod-0-N","object":"chat.completion.chunk","created":T,"model":"m","system_fingerprint":"pod-0","choices":[{"index":0,"delta":{"content":"tok0 "},"finish_reason":null}]}`,
			`{"id":"chatcmpl-pod-0-N","object":"chat.completion.chunk","created":T,"model":"m","system_fingerprint":"pod-0","choices":[{"index":0,"delta":{"content":"tok1 "},"finish_reason":null}]}`,
			`{"id":"chatcmpl-pod-0-N","object":"chat.completion.chunk","created":T,"model":"m","system_fingerprint":"pod-0","choices":[{"index":0,"delta":{"content":"tok2 "},"finish_reason":null}]}`,
			`{"id":"chatcmpl-pod-0-N","object":"chat.completion.chunk","created":T,"model":"m","system_fingerprint":"pod-0","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`,
		}
		if usage {
			want = append(want, `{"id":"chatcmpl-pod-0-N","object":"chat.completion.chunk","created":T,"model":"m","system_fingerprint":"pod-0","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3,"total_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}}`) // "true" is 1 token
		}
		want = append(want, "[DONE]")
		if len(events) != len(want) {
			t.Fatalf("include_usage %v: %d events, want %d:\n%s", usage, len(events), len(want), strings.Join(events, "\n"))
		}
		for i, e := range events {
			// The id's number and the creation time vary.
			e = idNumber.ReplaceAllString(e, `"id":"chatcmpl-pod-0-N"`)
			e = created.ReplaceAllString(e, `"created":T`)
			if e != want[i] {
				t.Errorf("include_usage %v: event %d\n got %s\nwant %s", usage, i, e, want[i])
			}
		}
	}
}

func TestUsage(t *testing.T) {
	ps := startPods(t, 1, Config{DecodeTokensPerSecond: 2000, DefaultMaxTokens: 5})
	msgs := []Message{{Role: "system", Content: text("sys", 100)}, {Role: "user", Content: text("user", 41)}}
	streamed := mustChat(t, ps[0].URL(), ChatRequest{Messages: msgs, MaxTokens: 7, Stream: true})
	if streamed.PromptTokens != 25+11 || streamed.CompletionTokens != 7 || streamed.Tokens != 7 || streamed.Text != answerText(7) {
		t.Errorf("streamed: %+v, want 36 prompt tokens, 7 completion tokens and events, %q", streamed, answerText(7))
	}
	plain := mustChat(t, ps[0].URL(), ChatRequest{Model: "x", Messages: msgs})
	if plain.PromptTokens != 36 || plain.CompletionTokens != 5 || plain.Tokens != 5 || plain.Text != answerText(5) || plain.DecodeRate != 0 {
		t.Errorf("non-streamed with the default max tokens: %+v, want 36 prompt tokens, 5 completion tokens, %q", plain, answerText(5))
	}
	if ct := plain.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("non-streamed Content-Type %q", ct)
	}
	// The same prompt again: all cached.
	if plain.CachedTokens != 36 {
		t.Errorf("the same prompt again: %d cached tokens, want 36", plain.CachedTokens)
	}

	resp, err := http.Post(ps[0].URL()+"/v1/chat/completions", "application/json", strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Choices []struct {
			Message      Message `json:"message"`
			FinishReason string  `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if doc.ID != "chatcmpl-pod-0-3" || doc.Object != "chat.completion" || len(doc.Choices) != 1 ||
		doc.Choices[0].Message != (Message{Role: "assistant", Content: "tok0 tok1 "}) || doc.Choices[0].FinishReason != "length" ||
		doc.Usage.PromptTokens != 1 || doc.Usage.CompletionTokens != 2 || doc.Usage.TotalTokens != 3 {
		t.Errorf("chat.completion %+v", doc)
	}
}

func TestCompletions(t *testing.T) {
	ps := startPods(t, 1, Config{DecodeTokensPerSecond: 2000})
	prompt := text("doc", 1000) // 250 tokens, 3 whole 256-byte blocks
	first := Complete(context.Background(), nil, ps[0].URL(), CompletionRequest{Prompt: prompt, MaxTokens: 4, Stream: true}, nil)
	if first.Err != nil || first.Text != answerText(4) || first.Tokens != 4 || first.PromptTokens != 250 || first.CachedTokens != 0 {
		t.Fatalf("first completion %+v", first)
	}
	second := Complete(context.Background(), nil, ps[0].URL(), CompletionRequest{Prompt: prompt[:900] + " something else", MaxTokens: 3}, nil)
	if second.Err != nil || second.Text != answerText(3) || second.CompletionTokens != 3 {
		t.Fatalf("second completion %+v", second)
	}
	if second.CachedTokens != 3*64 {
		t.Errorf("a prompt sharing 900 bytes: %d cached tokens, want 192 (three 256-byte blocks)", second.CachedTokens)
	}

	_, events := rawEvents(t, ps[0].URL()+"/v1/completions", `{"prompt":"hi","max_tokens":1,"stream":true}`)
	if len(events) != 3 || !strings.Contains(events[0], `"object":"text_completion"`) || !strings.Contains(events[0], `"text":"tok0 "`) ||
		!strings.Contains(events[1], `"finish_reason":"length"`) || events[2] != "[DONE]" {
		t.Errorf("completion stream without usage:\n%s", strings.Join(events, "\n"))
	}
}

type respAnswer struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Output []struct {
		Type    string `json:"type"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage responseUsage `json:"usage"`
}

func respond(t *testing.T, p *Pod, input, previous string) (respAnswer, time.Duration) {
	t.Helper()
	b, _ := json.Marshal(responseBody{Input: input, PreviousResponseID: previous, MaxOutputTokens: 3, Stream: true})
	start := time.Now()
	resp, err := http.Post(p.URL()+"/v1/responses", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a respAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatal(err)
	}
	return a, time.Since(start)
}

func TestResponses(t *testing.T) {
	ps := startPods(t, 2, Config{PrefillTokensPerSecond: 10000, DecodeTokensPerSecond: 2000})
	input := text("input", 4000) // 1000 tokens
	first, _ := respond(t, ps[0], input, "")
	if first.ID != "resp_pod-0_1" || first.Object != "response" || len(first.Output) != 1 || first.Output[0].Type != "message" ||
		len(first.Output[0].Content) != 1 || first.Output[0].Content[0].Type != "output_text" || first.Output[0].Content[0].Text != answerText(3) {
		t.Fatalf("first response %+v", first)
	}
	if u := first.Usage; u.InputTokens != 1000 || u.OutputTokens != 3 || u.TotalTokens != 1003 || u.InputTokensDetails.CachedTokens != 0 {
		t.Errorf("first response usage %+v", u)
	}
	chain := 1000 + tokenCount(answerText(3))
	next := text("next", 400) // 100 tokens
	var other respAnswer
	timing(t, func(int) []string {
		ps.Reset()
		same, sameTime := respond(t, ps[0], next, first.ID)
		if u := same.Usage; u.InputTokens != chain+100 || u.InputTokensDetails.CachedTokens != chain {
			t.Errorf("previous_response_id on the same pod: usage %+v, want %d input tokens, %d cached", u, chain+100, chain)
		}
		var otherTime time.Duration
		other, otherTime = respond(t, ps[1], next, first.ID)
		if u := other.Usage; u.InputTokens != 500 || u.InputTokensDetails.CachedTokens != 0 {
			t.Errorf("previous_response_id on another pod: usage %+v, want 500 input tokens (4x the input cold), none cached", u)
		}
		if s := ps.Stats(); s[0].PrefillTokens != 100 || s[1].PrefillTokens != 500 {
			t.Errorf("prefill tokens %d on the same pod, %d on the other; want 100 and 500", s[0].PrefillTokens, s[1].PrefillTokens)
		}
		t.Logf("previous_response_id: %v on the same pod, %v on the other", sameTime, otherTime)
		if otherTime-sameTime < 20*time.Millisecond {
			return []string{fmt.Sprintf("the other pod took %v, the same pod %v; want the other about 40ms slower", otherTime, sameTime)}
		}
		return nil
	})
	// The chain continues on the pod that answered the unknown id.
	third, _ := respond(t, ps[1], "more", other.ID)
	if u := third.Usage; u.InputTokensDetails.CachedTokens != 500+tokenCount(answerText(3)) {
		t.Errorf("the chain started cold: usage %+v", u)
	}
}

func TestEndpoints(t *testing.T) {
	ps := startPods(t, 1, Config{Name: "sim", Model: "tiny"})
	p := ps[0]
	if p.Name() != "sim-0" || ps.Peers()[0] != fmt.Sprintf("127.0.0.1:%d", p.Port()) || p.URL() != "http://"+p.Addr() {
		t.Errorf("name %q, peers %v, port %d, url %q", p.Name(), ps.Peers(), p.Port(), p.URL())
	}
	get := func(method, path, body string) (int, string, http.Header) {
		req, _ := http.NewRequest(method, p.URL()+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	for _, c := range []struct {
		method, path, body string
		status             int
		contains           string
	}{
		{"GET", "/health", "", 200, "ok"},
		{"GET", "/v1/models", "", 200, `"data":[{"id":"tiny","object":"model"`},
		{"GET", "/v1/chat/completions", "", 404, "no endpoint"},
		{"POST", "/v2/anything", "{}", 404, "no endpoint"},
		{"POST", "/v1/chat/completions", "{not json", 400, "not a valid request"},
		{"POST", "/v1/completions", `{"prompt":1}`, 400, "not a valid request"},
		{"POST", "/v1/responses", ``, 400, "not a valid request"},
		{"POST", "/v1/chat/completions", `{"messages":[]}`, 400, "messages is empty"},
	} {
		status, body, h := get(c.method, c.path, c.body)
		if status != c.status || !strings.Contains(body, c.contains) || h.Get("X-Sim-Pod") != "sim-0" {
			t.Errorf("%s %s: %d %q (X-Sim-Pod %q), want %d containing %q", c.method, c.path, status, body, h.Get("X-Sim-Pod"), c.status, c.contains)
		}
	}
	if s := p.Stats(); s.Requests != 0 {
		t.Errorf("%d requests counted, want none of the invalid ones", s.Requests)
	}

	// The client on a non-2xx answer.
	res := Chat(context.Background(), nil, p.URL()+"/v1/nothing", ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}, Stream: true}, nil)
	if res.Status != 404 || res.Err == nil || !strings.Contains(res.Text, "no endpoint") || res.Pod != "sim-0" {
		t.Errorf("client on a 404: %+v", res)
	}
	// The client with no answer at all.
	res = Chat(context.Background(), nil, "http://127.0.0.1:1", ChatRequest{}, nil)
	if res.Status != 0 || res.Err == nil {
		t.Errorf("client with no server: %+v", res)
	}
	// A base URL gets the endpoint's path, and hdr goes out.
	hdr := http.Header{"Host": {"route.example"}}
	if res := Chat(context.Background(), nil, p.URL(), ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}, MaxTokens: 1}, hdr); res.Err != nil || res.Text != "tok0 " {
		t.Errorf("base URL: %+v", res)
	}
}

func TestClientDisconnectEndsTheStream(t *testing.T) {
	ps := startPods(t, 1, Config{DecodeTokensPerSecond: 200})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan Result)
	go func() {
		done <- Chat(ctx, nil, ps[0].URL(), ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}, MaxTokens: 1000, Stream: true}, nil)
	}()
	testbin.WaitFor(t, 5*time.Second, "the stream to start decoding", func() bool { return ps[0].Stats().Active == 1 })
	cancel()
	if res := <-done; !errors.Is(res.Err, context.Canceled) {
		t.Errorf("cancelled stream: %d tokens, error %v; want context.Canceled", res.Tokens, res.Err)
	}
	testbin.WaitFor(t, 5*time.Second, "the pod to end the cancelled stream", func() bool {
		s := ps[0].Stats()
		return s.InFlight == 0 && s.Active == 0
	})
	// The stream of 1000 tokens at 200 tokens/s would take 5 s.
	if s := ps[0].Stats(); s.DecodedTokens > 200 {
		t.Errorf("%d tokens decoded for a stream cancelled after its first", s.DecodedTokens)
	}
}

func TestCloseFinishesAcceptedRequests(t *testing.T) {
	p, err := Start(Config{Name: "closing", DecodeTokensPerSecond: 300})
	if err != nil {
		t.Fatal(err)
	}
	addr := p.Addr()
	done := make(chan Result)
	go func() {
		done <- Chat(context.Background(), nil, p.URL(), ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}, MaxTokens: 30, Stream: true}, nil)
	}()
	testbin.WaitFor(t, 5*time.Second, "the stream to start decoding", func() bool { return p.Stats().Active == 1 })
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.Err != nil || res.Tokens != 30 {
		t.Errorf("the stream accepted before Close: %d tokens, error %v", res.Tokens, res.Err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("the closed pod still accepts connections")
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// stream is a complete chat stream as the pod writes it, with a comment,
// CRLF line ends, and an event with two data lines.
const stream = ": keep-alive\r\n\r\n" +
	"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n" +
	"data: {\"choices\":[{\"delta\":{\"content\":\"tok0 \"}}]}\r\n\r\n" +
	"event: message\nid: 7\ndata: {\"choices\":[{\"delta\":\ndata: {\"content\":\"tok1 \"}}]}\n\n" +
	"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n" +
	"data: [DONE]\n\n"

func TestSSEReaderSplitReads(t *testing.T) {
	r := newSSEReader(iotest.OneByteReader(strings.NewReader(stream + "data: last, unterminated")))
	want := []string{
		`{"choices":[{"delta":{"role":"assistant"}}]}`,
		`{"choices":[{"delta":{"content":"tok0 "}}]}`,
		"{\"choices\":[{\"delta\":\n{\"content\":\"tok1 \"}}]}",
		`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`,
		"[DONE]",
		"last, unterminated",
	}
	for i, w := range want {
		got, err := r.next()
		if err != nil || got != w {
			t.Fatalf("event %d: %q, %v; want %q", i, got, err, w)
		}
	}
	if got, err := r.next(); !errors.Is(err, io.EOF) {
		t.Errorf("after the last event: %q, %v; want io.EOF", got, err)
	}
}

func TestReadStream(t *testing.T) {
	// One byte at a time; the event with two data lines is valid JSON
	// once joined, and holds the second token.
	var res Result
	readStream(iotest.OneByteReader(strings.NewReader(stream)), time.Now(), &res)
	if res.Err != nil || res.Tokens != 2 || res.Text != "tok0 tok1 " || res.PromptTokens != 3 || res.CompletionTokens != 2 {
		t.Errorf("stream read one byte at a time: %+v", res)
	}
	res = Result{}
	readStream(strings.NewReader(stream[:strings.Index(stream, "data: [DONE]")]), time.Now(), &res)
	if res.Err == nil || res.Tokens != 2 {
		t.Errorf("a stream cut before [DONE]: %+v, want an error", res)
	}
	res = Result{}
	readStream(strings.NewReader("data: {oops\n\n"), time.Now(), &res)
	if res.Err == nil {
		t.Error("an event that is not JSON: no error")
	}
}

func TestConversation(t *testing.T) {
	c := Conversation{System: "be brief", FirstUser: "a document", MaxTokens: 4}
	r1 := c.Next("first question")
	want := []Message{{"system", "be brief"}, {"user", "a document"}, {"user", "first question"}}
	if fmt.Sprint(r1.Messages) != fmt.Sprint(want) || !r1.Stream || r1.MaxTokens != 4 {
		t.Fatalf("first turn %+v", r1)
	}
	c.Record("answer one")
	r2 := c.Next("second question")
	want = append(want, Message{"assistant", "answer one"}, Message{"user", "second question"})
	if fmt.Sprint(r2.Messages) != fmt.Sprint(want) || len(r1.Messages) != 3 {
		t.Errorf("second turn %+v (first turn now %+v)", r2, r1)
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	var f []float64
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
		f = append(f, float64(i))
	}
	for _, c := range []struct{ p, want float64 }{{0, 1}, {0.5, 50}, {0.99, 99}, {1, 100}, {2, 100}} {
		if got := Percentile(d, c.p); got != time.Duration(c.want)*time.Millisecond {
			t.Errorf("Percentile(%v) = %v, want %vms", c.p, got, c.want)
		}
		if got := PercentileFloat(f, c.p); got != c.want {
			t.Errorf("PercentileFloat(%v) = %v, want %v", c.p, got, c.want)
		}
	}
	if d[0] != 100*time.Millisecond || Percentile(nil, 0.5) != 0 || PercentileFloat(nil, 0.5) != 0 {
		t.Error("input reordered, or no samples not 0")
	}
}

func TestPrefixCacheEvictsLeastRecentlyUsedLongestFirst(t *testing.T) {
	c := newPrefixCache(10)
	a := chatKeys([]Message{{"user", text("a", 12)}, {"assistant", text("b", 8)}})  // costs 3 and 2
	b := chatKeys([]Message{{"user", text("c", 16)}, {"assistant", text("d", 12)}}) // costs 4 and 3
	c.insert(a)
	if got := c.lookup(a); got != 5 {
		t.Fatalf("lookup of a cached prefix: %d, want 5", got)
	}
	c.insert(b) // 12 tokens: a's longest prefix goes
	if got := c.lookup(a); got != 3 {
		t.Errorf("after eviction: %d, want 3 (a's first message only)", got)
	}
	if got := c.lookup(b); got != 7 || c.used != 10 {
		t.Errorf("b: %d, used %d; want 7 and 10", got, c.used)
	}
	c.insert(chatKeys([]Message{{"user", text("e", 44)}})) // 11 tokens: more than the capacity
	if got, used := c.lookup(b), c.used; got != 7 || used != 10 {
		t.Errorf("after a too large prefix: b %d, used %d; want 7 and 10", got, used)
	}
}
