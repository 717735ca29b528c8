package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// backend is a small local HTTP server standing in for one model pod (a
// video generation pod or a vLLM pod): it answers every request with its
// own name, so requests through nginx show which backend served them.
type backend struct {
	name string
	addr *net.TCPAddr
	srv  *http.Server
}

func (d *demo) startBackend(name string) (*backend, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(d.host.String(), "0"))
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", name, err)
	}
	b := &backend{name: name, addr: l.Addr().(*net.TCPAddr)}
	b.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s %s\n", b.name, r.URL.Path)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go b.srv.Serve(l)
	return b, nil
}

func (b *backend) endpoint() endpoint {
	return endpoint{ip: b.addr.IP.String(), port: int32(b.addr.Port)}
}

// close stops the server: its port then refuses connections (closing
// twice is harmless).
func (b *backend) close() { b.srv.Close() }

func (d *demo) stopBackends() {
	for _, b := range append(d.video, d.llm...) {
		b.close()
	}
	d.video, d.llm = nil, nil
}

// videoRound sends n requests through nginx's dispatch port to the video
// route (as a client would: /wan-video/v2/…, with an API key) and returns
// which backends answered, sorted, and how many requests failed. Requests
// are paced at the route's upload_req_limit (10r/s) so the limit never
// delays or rejects them.
func (d *demo) videoRound(ctx context.Context, n int) (served []string, failed int) {
	return d.round(ctx, n, 110*time.Millisecond, func() *http.Request {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, d.nginx.URL(videoRoute)+"v2/video_generation/tasks", nil)
		req.Header.Set("Authorization", "Bearer "+videoAPIKey)
		return req
	})
}

// llmPath is what the llm requests ask for, under the route's prefix.
const llmPath = "v1/chat/completions"

// llmRequests numbers llmRound's requests, so that each has its own prompt.
var llmRequests atomic.Int64

// llmRound sends n chat completions through nginx's dispatch port to the
// llm route (/qwen/v1/chat/completions, dispatched to the route's server,
// where the reference lua engine picks the peer) and returns which
// backends answered, sorted, and how many requests failed. Each request
// is a conversation of its own (a prompt never sent before): the engine
// keeps a conversation on one pod (session affinity, keyed by its first
// messages), and these rounds show which pods serve the route, not
// placement.
func (d *demo) llmRound(ctx context.Context, n int) (served []string, failed int) {
	return d.round(ctx, n, 20*time.Millisecond, func() *http.Request {
		prompt := "request " + strconv.FormatInt(llmRequests.Add(1), 10)
		body := `{"model":"` + llmModel + `","messages":[{"role":"user","content":"` + prompt + `"}],"max_tokens":8}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.nginx.URL(llmRoute)+llmPath, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		return req
	})
}

// round sends n requests made by mk, pace apart, each on a new connection,
// and returns which backends answered 200 (sorted) and how many did not.
func (d *demo) round(ctx context.Context, n int, pace time.Duration, mk func() *http.Request) (served []string, failed int) {
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	seen := map[string]bool{}
	for i := 0; i < n; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return nil, n
			case <-time.After(pace):
			}
		}
		resp, err := c.Do(mk())
		if err != nil {
			failed++
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			failed++
			continue
		}
		name, _, _ := strings.Cut(string(body), " ")
		seen[name] = true
	}
	for k := range seen {
		served = append(served, k)
	}
	slices.Sort(served)
	return served, failed
}

func backendNames(bs []*backend) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.name)
	}
	slices.Sort(out)
	return out
}

func videoName(i int) string { return "video-" + strconv.Itoa(i) }
func llmName(i int) string   { return "qwen-" + strconv.Itoa(i) }
