package llmsim

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// maxBody bounds a request body.
const maxBody = 32 << 20

// maxLag is how far behind its schedule a decoding stream may fall and
// still catch up (decode).
const maxLag = 100 * time.Millisecond

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// The request bodies, as the pod reads them and the client writes them.
type (
	streamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	}
	chatBody struct {
		Model               string         `json:"model,omitempty"`
		Messages            []Message      `json:"messages"`
		MaxTokens           int            `json:"max_tokens,omitempty"`
		MaxCompletionTokens int            `json:"max_completion_tokens,omitempty"`
		Stream              bool           `json:"stream,omitempty"`
		StreamOptions       *streamOptions `json:"stream_options,omitempty"`
	}
	completionBody struct {
		Model         string         `json:"model,omitempty"`
		Prompt        string         `json:"prompt"`
		MaxTokens     int            `json:"max_tokens,omitempty"`
		Stream        bool           `json:"stream,omitempty"`
		StreamOptions *streamOptions `json:"stream_options,omitempty"`
	}
	responseBody struct {
		Model              string `json:"model,omitempty"`
		Input              string `json:"input"`
		PreviousResponseID string `json:"previous_response_id,omitempty"`
		MaxOutputTokens    int    `json:"max_output_tokens,omitempty"`
		Stream             bool   `json:"stream,omitempty"`
	}
)

// The answers.
type (
	tokenDetails struct {
		CachedTokens int `json:"cached_tokens"`
	}
	usage struct {
		PromptTokens        int           `json:"prompt_tokens"`
		CompletionTokens    int           `json:"completion_tokens"`
		TotalTokens         int           `json:"total_tokens"`
		PromptTokensDetails *tokenDetails `json:"prompt_tokens_details,omitempty"`
	}
	delta struct {
		Role    string `json:"role,omitempty"`
		Content string `json:"content,omitempty"`
	}
	chatChoice struct {
		Index        int      `json:"index"`
		Message      *Message `json:"message,omitempty"`
		Delta        *delta   `json:"delta,omitempty"`
		FinishReason *string  `json:"finish_reason"`
	}
	textChoice struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		Logprobs     *int    `json:"logprobs"`
		FinishReason *string `json:"finish_reason"`
	}
	// completion is a chat.completion, a chat.completion.chunk or a
	// text_completion (chunk or not): Choices holds chatChoice or
	// textChoice values.
	completion struct {
		ID                string `json:"id"`
		Object            string `json:"object"`
		Created           int64  `json:"created"`
		Model             string `json:"model"`
		SystemFingerprint string `json:"system_fingerprint"`
		Choices           any    `json:"choices"`
		Usage             *usage `json:"usage,omitempty"`
	}
	outputText struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		Annotations []any  `json:"annotations"`
	}
	outputItem struct {
		Type    string       `json:"type"`
		ID      string       `json:"id"`
		Status  string       `json:"status"`
		Role    string       `json:"role"`
		Content []outputText `json:"content"`
	}
	responseUsage struct {
		InputTokens        int          `json:"input_tokens"`
		InputTokensDetails tokenDetails `json:"input_tokens_details"`
		OutputTokens       int          `json:"output_tokens"`
		TotalTokens        int          `json:"total_tokens"`
	}
	response struct {
		ID                 string        `json:"id"`
		Object             string        `json:"object"`
		CreatedAt          int64         `json:"created_at"`
		Model              string        `json:"model"`
		Status             string        `json:"status"`
		PreviousResponseID string        `json:"previous_response_id,omitempty"`
		SystemFingerprint  string        `json:"system_fingerprint"`
		Output             []outputItem  `json:"output"`
		Usage              responseUsage `json:"usage"`
	}
	apiError struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
)

var finishLength = "length"

// tokenText is the text of output token i: "tok<i> ".
func tokenText(i int) string { return "tok" + strconv.Itoa(i) + " " }

// decodeBody reads r's JSON body into v, or answers 400 and reports
// false.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "the body is not a valid request: "+err.Error())
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encode answer: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, typ, msg string) {
	var e apiError
	e.Error.Message, e.Error.Type = msg, typ
	writeJSON(w, status, e)
}

func (p *Pod) serveModels(w http.ResponseWriter) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	writeJSON(w, http.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{ID: p.cfg.Model, Object: "model", Created: time.Now().Unix(), OwnedBy: "llmsim"}}})
}

func (p *Pod) model(requested string) string {
	if requested != "" {
		return requested
	}
	return p.cfg.Model
}

func (p *Pod) maxTokens(requested int) int {
	if requested > 0 {
		return requested
	}
	return p.cfg.DefaultMaxTokens
}

// admit counts a generation request in. measure, called under the pod's
// mutex, returns the request's prompt tokens and how many of them are
// cached. admit returns the request's sequence number and those counts;
// the caller calls done when the request ends.
func (p *Pod) admit(measure func() (prompt, cached int)) (seq, prompt, cached int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	prompt, cached = measure()
	cached = min(cached, prompt)
	p.stats.Requests++
	p.stats.InFlight++
	p.stats.CacheHitTokens += cached
	p.stats.PrefillTokens += prompt - cached
	return p.seq, prompt, cached
}

func (p *Pod) done() {
	p.mu.Lock()
	p.stats.InFlight--
	p.mu.Unlock()
}

func (p *Pod) insert(keys []prefixKey) {
	p.mu.Lock()
	p.cache.insert(keys)
	p.mu.Unlock()
}

// prefill waits the time to first token of a prompt with uncached tokens
// not in the cache.
func (p *Pod) prefill(ctx context.Context, uncached int) error {
	d := p.cfg.BaseTTFT + time.Duration(float64(uncached)/p.cfg.PrefillTokensPerSecond*float64(time.Second))
	return sleep(ctx, d)
}

// sleep waits d on a timer, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// decode generates n tokens, calling emit with each one's text. The
// first goes out at once (prefill made it); before each later one the
// stream waits k/capacity seconds, k read just before as the number of
// streams decoding then, this one included. The waits run on a schedule
// (each token due one wait after the previous one was due), so the
// overhead of sending a token does not slow the stream down. A stream
// that fell behind its schedule (a busy machine, a reader slow to take
// the bytes) sends its late tokens at once, as vLLM's output queue
// would, when it is at most maxLag (or one wait) behind; further
// behind, it restarts its schedule from now. decode ends early when ctx is done or emit fails.
func (p *Pod) decode(ctx context.Context, n int, emit func(string) error) error {
	if n <= 0 {
		return nil
	}
	if err := emit(tokenText(0)); err != nil {
		return err
	}
	p.mu.Lock()
	p.stats.DecodedTokens++
	if n == 1 {
		p.mu.Unlock()
		return nil
	}
	p.stats.Active++
	p.stats.MaxActive = max(p.stats.MaxActive, p.stats.Active)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.stats.Active--
		p.mu.Unlock()
	}()
	due := time.Now()
	for i := 1; i < n; i++ {
		p.mu.Lock()
		k := p.stats.Active
		p.mu.Unlock()
		wait := time.Duration(float64(k) / p.cfg.DecodeTokensPerSecond * float64(time.Second))
		due = due.Add(wait)
		now := time.Now()
		if ahead := due.Sub(now); ahead > 0 {
			if err := sleep(ctx, ahead); err != nil {
				return err
			}
		} else if -ahead > max(wait, maxLag) {
			due = now
		}
		if err := emit(tokenText(i)); err != nil {
			return err
		}
		p.mu.Lock()
		p.stats.DecodedTokens++
		p.mu.Unlock()
	}
	return nil
}

// eventStream writes Server-Sent Events, flushing each one.
type eventStream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// startStream writes the headers of a 200 event stream.
func startStream(w http.ResponseWriter) *eventStream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &eventStream{w: w, rc: http.NewResponseController(w)}
}

// send writes one event with v as JSON, or with v itself when v is a
// string.
func (s *eventStream) send(v any) error {
	var b []byte
	if str, ok := v.(string); ok {
		b = []byte(str)
	} else {
		var err error
		if b, err = json.Marshal(v); err != nil {
			return fmt.Errorf("encode event: %w", err)
		}
	}
	buf := make([]byte, 0, len(b)+8)
	buf = append(buf, "data: "...)
	buf = append(append(buf, b...), "\n\n"...)
	if _, err := s.w.Write(buf); err != nil {
		return fmt.Errorf("write event: %w", err)
	}
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("flush event: %w", err)
	}
	return nil
}

func (p *Pod) usage(prompt, cached, n int) *usage {
	return &usage{PromptTokens: prompt, CompletionTokens: n, TotalTokens: prompt + n, PromptTokensDetails: &tokenDetails{CachedTokens: cached}}
}

func setCached(w http.ResponseWriter, cached int) {
	w.Header().Set("X-Sim-Cached-Tokens", strconv.Itoa(cached))
}

func (p *Pod) serveChat(w http.ResponseWriter, r *http.Request) {
	var req chatBody
	if !decodeBody(w, r, &req) {
		return
	}
	if len(req.Messages) == 0 {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "messages is empty")
		return
	}
	n := p.maxTokens(cmp.Or(req.MaxTokens, req.MaxCompletionTokens))
	keys := chatKeys(req.Messages)
	seq, prompt, cached := p.admit(func() (int, int) { return keys[len(keys)-1].tokens, p.cache.lookup(keys) })
	defer p.done()
	ctx := r.Context()
	if p.prefill(ctx, prompt-cached) != nil {
		return // the client is gone; nothing was written
	}
	p.insert(keys)
	head := completion{
		ID:                fmt.Sprintf("chatcmpl-%s-%d", p.cfg.Name, seq),
		Created:           time.Now().Unix(),
		Model:             p.model(req.Model),
		SystemFingerprint: p.cfg.Name,
	}
	var text strings.Builder
	// cacheAnswer caches the conversation with the answer as its next
	// message, before the answer's last event goes out, so a next turn
	// sent the moment the answer ends finds it.
	cacheAnswer := func() {
		p.insert(chatKeys(append(slices.Clip(req.Messages), Message{Role: "assistant", Content: text.String()})))
	}
	setCached(w, cached)
	if !req.Stream {
		if p.decode(ctx, n, func(t string) error { text.WriteString(t); return nil }) != nil {
			return
		}
		cacheAnswer()
		head.Object = "chat.completion"
		head.Choices = []chatChoice{{Message: &Message{Role: "assistant", Content: text.String()}, FinishReason: &finishLength}}
		head.Usage = p.usage(prompt, cached, n)
		writeJSON(w, http.StatusOK, head)
		return
	}
	s := startStream(w)
	head.Object = "chat.completion.chunk"
	chunk := func(d delta, finish *string) completion {
		c := head
		c.Choices = []chatChoice{{Delta: &d, FinishReason: finish}}
		return c
	}
	if s.send(chunk(delta{Role: "assistant"}, nil)) != nil {
		return
	}
	err := p.decode(ctx, n, func(t string) error {
		text.WriteString(t)
		return s.send(chunk(delta{Content: t}, nil))
	})
	if err != nil {
		return
	}
	cacheAnswer()
	p.finishStream(s, chunk(delta{}, &finishLength), head, req.StreamOptions, p.usage(prompt, cached, n))
}

// finishStream sends a stream's last events: the one with the finish
// reason, the usage when the request asked for it, and [DONE].
func (p *Pod) finishStream(s *eventStream, last, head completion, opts *streamOptions, u *usage) {
	if s.send(last) != nil {
		return
	}
	if opts != nil && opts.IncludeUsage {
		head.Choices = []chatChoice{}
		head.Usage = u
		if s.send(head) != nil {
			return
		}
	}
	_ = s.send("[DONE]")
}

func (p *Pod) serveCompletion(w http.ResponseWriter, r *http.Request) {
	var req completionBody
	if !decodeBody(w, r, &req) {
		return
	}
	n := p.maxTokens(req.MaxTokens)
	keys := textKeys(req.Prompt)
	seq, prompt, cached := p.admit(func() (int, int) { return tokenCount(req.Prompt), p.cache.lookup(keys) })
	defer p.done()
	ctx := r.Context()
	if p.prefill(ctx, prompt-cached) != nil {
		return
	}
	p.insert(keys)
	head := completion{
		ID:                fmt.Sprintf("cmpl-%s-%d", p.cfg.Name, seq),
		Object:            "text_completion",
		Created:           time.Now().Unix(),
		Model:             p.model(req.Model),
		SystemFingerprint: p.cfg.Name,
	}
	var text strings.Builder
	cacheAnswer := func() { p.insert(textKeys(req.Prompt + text.String())) }
	setCached(w, cached)
	if !req.Stream {
		if p.decode(ctx, n, func(t string) error { text.WriteString(t); return nil }) != nil {
			return
		}
		cacheAnswer()
		head.Choices = []textChoice{{Text: text.String(), FinishReason: &finishLength}}
		head.Usage = p.usage(prompt, cached, n)
		writeJSON(w, http.StatusOK, head)
		return
	}
	s := startStream(w)
	chunk := func(t string, finish *string) completion {
		c := head
		c.Choices = []textChoice{{Text: t, FinishReason: finish}}
		return c
	}
	err := p.decode(ctx, n, func(t string) error {
		text.WriteString(t)
		return s.send(chunk(t, nil))
	})
	if err != nil {
		return
	}
	cacheAnswer()
	p.finishStream(s, chunk("", &finishLength), head, req.StreamOptions, p.usage(prompt, cached, n))
}

// serveResponse answers /v1/responses, always as one JSON document. A
// response's chain is every earlier input and output of its
// conversation; the pod remembers each response's chain length in
// tokens (for as long as it runs), and a previous_response_id it knows
// has its whole chain cached. An id it does not know stands for a chain
// it must prefill cold, counted as 4 times the new input.
func (p *Pod) serveResponse(w http.ResponseWriter, r *http.Request) {
	var req responseBody
	if !decodeBody(w, r, &req) {
		return
	}
	n := p.maxTokens(req.MaxOutputTokens)
	input := tokenCount(req.Input)
	seq, prompt, cached := p.admit(func() (int, int) {
		if req.PreviousResponseID == "" {
			return input, 0
		}
		if chain, ok := p.chains[req.PreviousResponseID]; ok {
			return chain + input, chain
		}
		return 5 * input, 0
	})
	defer p.done()
	ctx := r.Context()
	if p.prefill(ctx, prompt-cached) != nil {
		return
	}
	var text strings.Builder
	if p.decode(ctx, n, func(t string) error { text.WriteString(t); return nil }) != nil {
		return
	}
	id := fmt.Sprintf("resp_%s_%d", p.cfg.Name, seq)
	p.mu.Lock()
	p.chains[id] = prompt + tokenCount(text.String())
	p.mu.Unlock()
	setCached(w, cached)
	writeJSON(w, http.StatusOK, response{
		ID:                 id,
		Object:             "response",
		CreatedAt:          time.Now().Unix(),
		Model:              p.model(req.Model),
		Status:             "completed",
		PreviousResponseID: req.PreviousResponseID,
		SystemFingerprint:  p.cfg.Name,
		Output: []outputItem{{
			Type:    "message",
			ID:      fmt.Sprintf("msg_%s_%d", p.cfg.Name, seq),
			Status:  "completed",
			Role:    "assistant",
			Content: []outputText{{Type: "output_text", Text: text.String(), Annotations: []any{}}},
		}},
		Usage: responseUsage{
			InputTokens:        prompt,
			InputTokensDetails: tokenDetails{CachedTokens: cached},
			OutputTokens:       n,
			TotalTokens:        prompt + n,
		},
	})
}
