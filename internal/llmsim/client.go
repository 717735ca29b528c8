package llmsim

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// maxErrorBody bounds how much of a non-2xx answer's body a Result keeps.
const maxErrorBody = 1 << 20

// Result is the measure of one request.
type Result struct {
	// Status is the HTTP status; 0 when no answer came.
	Status int
	// Pod is the answer's X-Sim-Pod header: the pod that served it.
	Pod string
	// TTFT is the time from the request's start to the first content
	// token received. For a non-streamed answer it is the time to the
	// whole answer, the first moment any token is seen.
	TTFT time.Duration
	// Duration is the time from the request's start to the end of the
	// answer (or to the error).
	Duration time.Duration
	// Tokens is the content events received. For a non-streamed answer it
	// is the usage's completion tokens.
	Tokens int
	// DecodeRate is the tokens after the first divided by the time from
	// the first to the last, in tokens per second; 0 for fewer than 2
	// tokens or a non-streamed answer.
	DecodeRate float64
	// Text is the generated content concatenated; for a non-2xx answer,
	// the body (its first MiB).
	Text string
	// Header is the answer's header.
	Header http.Header
	// Err is why the request did not get a complete answer: the request
	// failed, the status was not 2xx, the stream broke off before its
	// [DONE] event, or an event was not valid JSON.
	Err error
	// PromptTokens, CompletionTokens and CachedTokens are the answer's
	// usage (prompt_tokens, completion_tokens and
	// prompt_tokens_details.cached_tokens), when it has one.
	PromptTokens, CompletionTokens, CachedTokens int
}

// ChatRequest is one /v1/chat/completions request. With Stream the
// answer is streamed with stream_options.include_usage.
type ChatRequest struct {
	Model     string
	Messages  []Message
	MaxTokens int
	Stream    bool
}

// CompletionRequest is one /v1/completions request. With Stream the
// answer is streamed with stream_options.include_usage.
type CompletionRequest struct {
	Model     string
	Prompt    string
	MaxTokens int
	Stream    bool
}

// Chat sends req to url and measures the answer. url is the endpoint's
// URL, or a base URL with no path, to which /v1/chat/completions is
// added. hdr's fields are set on the request (a Host among them sets
// the request's host). c nil means http.DefaultClient. A streamed answer is
// parsed as it arrives, so TTFT and DecodeRate are what the client saw.
func Chat(ctx context.Context, c *http.Client, url string, req ChatRequest, hdr http.Header) Result {
	body := chatBody{Model: req.Model, Messages: req.Messages, MaxTokens: req.MaxTokens, Stream: req.Stream}
	if req.Stream {
		body.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	return post(ctx, c, endpoint(url, "/v1/chat/completions"), body, hdr)
}

// Complete is Chat for /v1/completions.
func Complete(ctx context.Context, c *http.Client, url string, req CompletionRequest, hdr http.Header) Result {
	body := completionBody{Model: req.Model, Prompt: req.Prompt, MaxTokens: req.MaxTokens, Stream: req.Stream}
	if req.Stream {
		body.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	return post(ctx, c, endpoint(url, "/v1/completions"), body, hdr)
}

// endpoint is raw with path added when raw has no path of its own.
func endpoint(raw, path string) string {
	u, err := url.Parse(raw)
	if err != nil || (u.Path != "" && u.Path != "/") {
		return raw
	}
	u.Path = path
	return u.String()
}

func post(ctx context.Context, c *http.Client, url string, body any, hdr http.Header) (res Result) {
	if c == nil {
		c = http.DefaultClient
	}
	start := time.Now()
	defer func() { res.Duration = time.Since(start) }()
	b, err := json.Marshal(body)
	if err != nil {
		res.Err = fmt.Errorf("encode request: %w", err)
		return res
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		res.Err = fmt.Errorf("post %s: %w", url, err)
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range hdr {
		req.Header[http.CanonicalHeaderKey(k)] = slices.Clone(vs)
	}
	if h := req.Header.Get("Host"); h != "" {
		req.Host = h
	}
	resp, err := c.Do(req)
	if err != nil {
		res.Err = fmt.Errorf("post %s: %w", url, err)
		return res
	}
	defer resp.Body.Close()
	res.Status, res.Header, res.Pod = resp.StatusCode, resp.Header, resp.Header.Get("X-Sim-Pod")
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		res.Text = string(b)
		res.Err = fmt.Errorf("post %s: status %d: %s", url, resp.StatusCode, snippet(res.Text))
		if err != nil {
			res.Err = fmt.Errorf("%w (reading the body: %w)", res.Err, err)
		}
		return res
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" {
		readStream(resp.Body, start, &res)
	} else {
		readDocument(resp.Body, start, &res)
	}
	if res.Err != nil {
		res.Err = fmt.Errorf("post %s: %w", url, res.Err)
	}
	return res
}

// snippet is s cut to a line's worth for an error message.
func snippet(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// answer is what the client reads of a completion, a chunk or an error
// body: every shape the pod writes, and OpenAI's.
type answer struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func (a *answer) fillUsage(res *Result) {
	if a.Usage == nil {
		return
	}
	res.PromptTokens, res.CompletionTokens = a.Usage.PromptTokens, a.Usage.CompletionTokens
	if a.Usage.PromptTokensDetails != nil {
		res.CachedTokens = a.Usage.PromptTokensDetails.CachedTokens
	}
}

// readStream reads an event stream into res, measuring each content
// event as it arrives.
func readStream(body io.Reader, start time.Time, res *Result) {
	events := newSSEReader(body)
	var text strings.Builder
	var first, last time.Time
	defer func() {
		res.Text = text.String()
		if !first.IsZero() {
			res.TTFT = first.Sub(start)
		}
		if span := last.Sub(first).Seconds(); res.Tokens >= 2 && span > 0 {
			res.DecodeRate = float64(res.Tokens-1) / span
		}
	}()
	for {
		data, err := events.next()
		if errors.Is(err, io.EOF) {
			res.Err = errors.New("the stream ended before its [DONE] event")
			return
		}
		if err != nil {
			res.Err = fmt.Errorf("read the stream: %w", err)
			return
		}
		if data == "[DONE]" {
			return
		}
		var a answer
		if err := json.Unmarshal([]byte(data), &a); err != nil {
			res.Err = fmt.Errorf("event %s: %w", snippet(data), err)
			return
		}
		if a.Error != nil {
			res.Err = fmt.Errorf("error event: %s", a.Error.Message)
			return
		}
		a.fillUsage(res)
		for _, c := range a.Choices {
			content := c.Delta.Content + c.Text
			if content == "" {
				continue
			}
			last = time.Now()
			if first.IsZero() {
				first = last
			}
			res.Tokens++
			text.WriteString(content)
		}
	}
}

// readDocument reads a non-streamed JSON answer into res.
func readDocument(body io.Reader, start time.Time, res *Result) {
	b, err := io.ReadAll(body)
	res.TTFT = time.Since(start)
	if err != nil {
		res.Err = fmt.Errorf("read the answer: %w", err)
		return
	}
	var a answer
	if err := json.Unmarshal(b, &a); err != nil {
		res.Text = string(b)
		res.Err = fmt.Errorf("answer %s: %w", snippet(string(b)), err)
		return
	}
	if len(a.Choices) > 0 {
		res.Text = a.Choices[0].Message.Content + a.Choices[0].Text
	}
	a.fillUsage(res)
	res.Tokens = res.CompletionTokens
}

// sseReader parses Server-Sent Events from a stream, however its reads
// split the bytes.
type sseReader struct {
	br *bufio.Reader
}

func newSSEReader(r io.Reader) *sseReader { return &sseReader{br: bufio.NewReader(r)} }

// next returns the data of the next event: its data fields joined by
// newlines. An event ends at a blank line, or at the end of the stream
// when it has data. Comment lines and fields other than data are
// skipped. At the end of the stream next returns io.EOF; a read error
// comes back as it is.
func (s *sseReader) next() (string, error) {
	var data strings.Builder
	has := false
	for {
		line, err := s.br.ReadString('\n')
		if line != "" {
			line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch {
			case line == "":
				if has {
					return data.String(), nil
				}
			case field == "data":
				if has {
					data.WriteByte('\n')
				}
				data.WriteString(value)
				has = true
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && has {
				return data.String(), nil
			}
			return "", err
		}
	}
}

// Conversation builds the requests of a multi-turn chat: each turn sends
// the messages so far plus a new user message, and the answer is
// recorded as the assistant message the next turn sends back, as a chat
// application does. On a pod that cached the previous turn, all of a
// turn's prompt but the new user message is a cache hit.
type Conversation struct {
	// System, when set, is the first message, with the role system.
	System string
	// FirstUser, when set, is the user message after System on the first
	// turn, before that turn's own user text.
	FirstUser string
	// Model and MaxTokens go into every request.
	Model     string
	MaxTokens int
	// Messages is the conversation so far.
	Messages []Message
}

// Next adds a user message of userText (none when it is empty) to the
// conversation and returns the streamed request of the turn. The first
// turn starts with System and FirstUser.
func (c *Conversation) Next(userText string) ChatRequest {
	if len(c.Messages) == 0 {
		if c.System != "" {
			c.Messages = append(c.Messages, Message{Role: "system", Content: c.System})
		}
		if c.FirstUser != "" {
			c.Messages = append(c.Messages, Message{Role: "user", Content: c.FirstUser})
		}
	}
	if userText != "" {
		c.Messages = append(c.Messages, Message{Role: "user", Content: userText})
	}
	return ChatRequest{Model: c.Model, Messages: slices.Clone(c.Messages), MaxTokens: c.MaxTokens, Stream: true}
}

// Record adds the answer of the turn as an assistant message.
func (c *Conversation) Record(answer string) {
	c.Messages = append(c.Messages, Message{Role: "assistant", Content: answer})
}

// Percentile is the p-quantile of d (p from 0 to 1, 0.99 for the 99th
// percentile) by nearest rank: the smallest sample with at least p of
// the samples at or below it. It is 0 for no samples and leaves d in its
// order.
func Percentile(d []time.Duration, p float64) time.Duration { return percentile(d, p) }

// PercentileFloat is Percentile for float64 samples.
func PercentileFloat(x []float64, p float64) float64 { return percentile(x, p) }

func percentile[T cmp.Ordered](xs []T, p float64) T {
	if len(xs) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}
