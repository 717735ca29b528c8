package llmsim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Config is a pod's name and performance. A zero field takes the default
// its comment gives.
type Config struct {
	// Name is reported in the X-Sim-Pod header of every response and in
	// the system_fingerprint of the JSON answers. Default "pod".
	Name string
	// Model is the model /v1/models lists and the answers name when the
	// request names none. Default "llmsim".
	Model string
	// Addr is the address Start listens on. Default "127.0.0.1:0".
	Addr string

	// DecodeTokensPerSecond is the pod's decode capacity, shared equally
	// by the streams decoding at each moment. Default 300.
	DecodeTokensPerSecond float64
	// PrefillTokensPerSecond is the prefill speed: the time to first
	// token is BaseTTFT plus the uncached prompt tokens divided by it.
	// Default 4000.
	PrefillTokensPerSecond float64
	// BaseTTFT is the time to first token of a fully cached prompt.
	// Default 20ms; a negative value means none.
	BaseTTFT time.Duration
	// CacheTokens is the prefix cache's capacity in tokens. Default
	// 200000; a negative value disables the cache.
	CacheTokens int
	// DefaultMaxTokens is the output length of a request that sets no
	// max_tokens. Default 16.
	DefaultMaxTokens int
	// ShutdownTimeout bounds how long Close waits for the requests in
	// progress to finish before it closes their connections. Default 5s.
	ShutdownTimeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = "pod"
	}
	if c.Model == "" {
		c.Model = "llmsim"
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:0"
	}
	if c.DecodeTokensPerSecond <= 0 {
		c.DecodeTokensPerSecond = 300
	}
	if c.PrefillTokensPerSecond <= 0 {
		c.PrefillTokensPerSecond = 4000
	}
	switch {
	case c.BaseTTFT == 0:
		c.BaseTTFT = 20 * time.Millisecond
	case c.BaseTTFT < 0:
		c.BaseTTFT = 0
	}
	if c.CacheTokens == 0 {
		c.CacheTokens = 200000
	}
	if c.DefaultMaxTokens <= 0 {
		c.DefaultMaxTokens = 16
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 5 * time.Second
	}
	return c
}

// Stats are a pod's counters. Requests, MaxActive, CacheHitTokens,
// PrefillTokens and DecodedTokens count since the pod started or since
// the last Reset; InFlight and Active are the present moment.
type Stats struct {
	// Requests counts the generation requests accepted (chat,
	// completions and responses with a valid body).
	Requests int
	// InFlight is the generation requests being served now, in prefill
	// or decoding.
	InFlight int
	// Active is the streams decoding now: past their first token and not
	// finished. They share the decode capacity.
	Active int
	// MaxActive is the peak of Active.
	MaxActive int
	// CacheHitTokens is the prompt tokens found in the prefix cache.
	CacheHitTokens int
	// PrefillTokens is the prompt tokens not found in the cache, which
	// the pod spent prefill time on.
	PrefillTokens int
	// DecodedTokens is the output tokens generated, counted as each one
	// is sent.
	DecodedTokens int
}

// Pod is one simulated vLLM server. It is an http.Handler (NewPod) or a
// listening server (Start). Its methods are safe for concurrent use.
type Pod struct {
	cfg Config

	mu     sync.Mutex
	cache  *prefixCache
	chains map[string]int // response id -> tokens of its whole chain
	seq    int
	stats  Stats

	ln        net.Listener
	srv       *http.Server
	served    chan struct{} // closed when srv.Serve has returned
	closeOnce sync.Once
	closeErr  error
}

// NewPod returns a pod that serves as an http.Handler and listens on
// nothing: Addr is "" and Close does nothing.
func NewPod(cfg Config) *Pod {
	cfg = cfg.withDefaults()
	return &Pod{cfg: cfg, cache: newPrefixCache(cfg.CacheTokens), chains: map[string]int{}}
}

// Start returns a pod listening on cfg.Addr (default 127.0.0.1 on a free
// port) and serving in the background until Close.
func Start(cfg Config) (*Pod, error) {
	p := NewPod(cfg)
	ln, err := net.Listen("tcp", p.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("llmsim pod %s: listen on %s: %w", p.cfg.Name, p.cfg.Addr, err)
	}
	p.ln = ln
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	p.served = make(chan struct{})
	go func() {
		defer close(p.served)
		// Serve returns http.ErrServerClosed after Shutdown or Close, the
		// only way it ends here.
		_ = p.srv.Serve(ln)
	}()
	return p, nil
}

// Name is the pod's name (X-Sim-Pod).
func (p *Pod) Name() string { return p.cfg.Name }

// Config is the pod's configuration with the defaults applied.
func (p *Pod) Config() Config { return p.cfg }

// Addr is the address the pod listens on, "127.0.0.1:<port>"; "" for a
// pod from NewPod.
func (p *Pod) Addr() string {
	if p.ln == nil {
		return ""
	}
	return p.ln.Addr().String()
}

// Port is the TCP port the pod listens on; 0 for a pod from NewPod.
func (p *Pod) Port() int {
	if a, ok := p.lnAddr(); ok {
		return a.Port
	}
	return 0
}

func (p *Pod) lnAddr() (*net.TCPAddr, bool) {
	if p.ln == nil {
		return nil, false
	}
	a, ok := p.ln.Addr().(*net.TCPAddr)
	return a, ok
}

// URL is the pod's base URL, "http://127.0.0.1:<port>"; "" for a pod
// from NewPod.
func (p *Pod) URL() string {
	if p.ln == nil {
		return ""
	}
	return "http://" + p.Addr()
}

// Close stops the pod as a real one stops: the listener closes at once,
// so new connections are refused, and the requests already accepted run
// to their end (http.Server.Shutdown). After Config.ShutdownTimeout the
// connections still open are closed and Close returns an error saying
// so. Close is safe to call more than once; the later calls return what
// the first one did.
func (p *Pod) Close() error {
	p.closeOnce.Do(func() {
		if p.srv == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ShutdownTimeout)
		defer cancel()
		if err := p.srv.Shutdown(ctx); err != nil {
			p.closeErr = fmt.Errorf("llmsim pod %s: shutdown: %w", p.cfg.Name, err)
			// Close ends the connections Shutdown left: their handlers
			// see their writes fail and their contexts done.
			_ = p.srv.Close()
		}
		<-p.served
	})
	return p.closeErr
}

// Stats returns a copy of the pod's counters.
func (p *Pod) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Reset zeroes the counters; InFlight and Active, which are the present
// moment, stay, and MaxActive restarts from Active. The prefix cache and
// the remembered responses stay too.
func (p *Pod) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats = Stats{InFlight: p.stats.InFlight, Active: p.stats.Active, MaxActive: p.stats.Active}
}

// ServeHTTP answers the pod's endpoints: POST /v1/chat/completions,
// POST /v1/completions, POST /v1/responses, GET /health and GET
// /v1/models. Anything else is 404.
func (p *Pod) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Sim-Pod", p.cfg.Name)
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions":
		p.serveChat(w, r)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/completions":
		p.serveCompletion(w, r)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/responses":
		p.serveResponse(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/health":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok"))
	case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
		p.serveModels(w)
	default:
		writeError(w, http.StatusNotFound, "not_found_error", fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path))
	}
}

// Pods is a set of pods started together.
type Pods []*Pod

// StartPods starts n pods with cfg, named <cfg.Name>-0 … <cfg.Name>-(n-1)
// (pod-0 … pod-(n-1) by default), each on 127.0.0.1 on a free port
// whatever cfg.Addr says. On an error it closes the pods it started.
func StartPods(n int, cfg Config) (Pods, error) {
	base := cfg.withDefaults().Name
	ps := make(Pods, 0, n)
	for i := range n {
		c := cfg
		c.Name = base + "-" + strconv.Itoa(i)
		c.Addr = "127.0.0.1:0"
		p, err := Start(c)
		if err != nil {
			_ = ps.Close()
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// Peers are the pods' addresses, "127.0.0.1:<port>", in order.
func (ps Pods) Peers() []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Addr()
	}
	return out
}

// ByName is the pod named name, or nil.
func (ps Pods) ByName(name string) *Pod {
	for _, p := range ps {
		if p.Name() == name {
			return p
		}
	}
	return nil
}

// Stats are the pods' counters, in order.
func (ps Pods) Stats() []Stats {
	out := make([]Stats, len(ps))
	for i, p := range ps {
		out[i] = p.Stats()
	}
	return out
}

// Reset resets every pod's counters.
func (ps Pods) Reset() {
	for _, p := range ps {
		p.Reset()
	}
}

// Close closes the pods one after another and joins their errors.
func (ps Pods) Close() error {
	var errs []error
	for _, p := range ps {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}
