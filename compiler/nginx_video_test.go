package compiler

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/schema/routespec"
)

// backend is a local test backend that counts and records requests.
type backend struct {
	*httptest.Server
	hits atomic.Int64
	mu   sync.Mutex
	reqs []*http.Request
}

func newBackend(t *testing.T, h http.HandlerFunc) *backend {
	t.Helper()
	b := &backend{}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.hits.Add(1)
		b.mu.Lock()
		b.reqs = append(b.reqs, r)
		b.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(b.Close)
	return b
}

func (b *backend) last() *http.Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.reqs) == 0 {
		return nil
	}
	return b.reqs[len(b.reqs)-1]
}

func (b *backend) endpoint(t *testing.T) Endpoint {
	h, p := hostPort(t, b.Listener.Addr().String())
	return Endpoint{IP: h, Port: p, Ready: true}
}

func (b *backend) vip(t *testing.T) *ServiceVIP {
	h, p := hostPort(t, b.Listener.Addr().String())
	return &ServiceVIP{IP: h, Port: p}
}

func text(s string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, s) }
}

// do sends a request through the dispatch server with client c (nil =
// default) and returns status, body and headers.
func do(t *testing.T, c *http.Client, method, url string, hdr map[string]string, body string) (int, string, http.Header) {
	t.Helper()
	if c == nil {
		c = http.DefaultClient
	}
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return resp.StatusCode, readAll(t, resp), resp.Header
}

var (
	backendTier = routespec.Peer{Use: "backend", Priority: 2}
	svcTier     = routespec.Peer{Use: "backend-svc", Priority: 1}
)

// TestNginxVideoFailover: refused connections move on to another peer
// (POST included: nothing was sent), backup servers take over when every
// primary refuses, and two video routes coexist in one http{}.
func TestNginxVideoFailover(t *testing.T) {
	n := startNginx(t)
	svc := newBackend(t, text("svc"))
	live := newBackend(t, text("live"))

	// Route a: every primary refuses; the backend-svc tier is backup.
	install(t, n, videoRoute("a", nil, backendTier, svcTier), Snapshot{
		Backends:       []Endpoint{{IP: "127.0.0.1", Port: refusingPort(t)}, {IP: "127.0.0.1", Port: refusingPort(t)}},
		BackendService: svc.vip(t),
	})
	// Route b: one refusing and one live primary, no backup.
	install(t, n, videoRoute("b", nil, backendTier, svcTier), Snapshot{
		Backends: []Endpoint{{IP: "127.0.0.1", Port: refusingPort(t)}, live.endpoint(t)},
	})

	for i := 0; i < 6; i++ {
		method := []string{"GET", "POST"}[i%2]
		if code, body, _ := do(t, nil, method, n.URL("a")+"v2/video_generation", nil, `{"prompt":"x"}`); code != 200 || body != "svc" {
			t.Fatalf("route a %s #%d: %d %q, want 200 from the backup tier", method, i, code, body)
		}
		if code, body, _ := do(t, nil, method, n.URL("b")+"v2/video_generation", nil, `{"prompt":"x"}`); code != 200 || body != "live" {
			t.Fatalf("route b %s #%d: %d %q, want 200 from the live primary", method, i, code, body)
		}
	}
	if got := live.hits.Load(); got != 6 {
		t.Errorf("live primary served %d requests, want 6", got)
	}
	if r := svc.last(); r == nil || r.URL.Path != "/v2/video_generation" {
		t.Errorf("backend saw %v, want the path without the /a prefix", r)
	}
}

// TestNginxVideo503: a 503 answer is passed to the client, not retried on
// another peer, and does not eject the backend.
func TestNginxVideo503(t *testing.T) {
	n := startNginx(t)
	busy := newBackend(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "overloaded", 503) })
	ok := newBackend(t, text("ok"))
	install(t, n, videoRoute("v", nil, backendTier), Snapshot{Backends: []Endpoint{busy.endpoint(t), ok.endpoint(t)}})

	const total = 20
	n503 := 0
	for i := 0; i < total; i++ {
		code, _, _ := do(t, nil, "GET", n.URL("v")+"v2/x", nil, "")
		switch code {
		case 503:
			n503++
		case 200:
		default:
			t.Fatalf("request %d: status %d", i, code)
		}
	}
	b, o := busy.hits.Load(), ok.hits.Load()
	if b+o != total {
		t.Errorf("backends saw %d requests for %d client requests: a 503 was retried", b+o, total)
	}
	if int64(n503) != b {
		t.Errorf("client got %d 503s, the busy backend answered %d", n503, b)
	}
	// Round robin over two peers: the busy one keeps its share, far past
	// max_fails=3, so it was never ejected.
	if b < total/2-1 {
		t.Errorf("busy backend got %d of %d requests: it was ejected", b, total)
	}
}

// TestNginxVideoAuthRange: API keys match byte for byte, the public path
// needs none, the 401 carries WWW-Authenticate: Bearer, Range answers 206,
// and the X-Forwarded headers reach the backend.
func TestNginxVideoAuthRange(t *testing.T) {
	n := startNginx(t)
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<14)
	be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "clip.mp4", time.Unix(0, 0), bytes.NewReader(payload))
	})
	hostile := `Sk"};#$x\]]'` // printable, no space or comma: a valid key
	install(t, n, videoRoute("vid", map[string]string{"api_keys": "sk-video-1," + hostile}, backendTier),
		Snapshot{Backends: []Endpoint{be.endpoint(t)}})
	url := n.URL("vid")

	for _, tc := range []struct {
		name, path, auth string
		want             int
	}{
		{"no key", "v2/video_generation", "", 401},
		{"wrong key", "v2/video_generation", "Bearer sk-video-3", 401},
		{"key in other case", "v2/video_generation", "Bearer SK-VIDEO-1", 401},
		{"key prefix", "v2/video_generation", "Bearer sk-video-", 401},
		{"key with suffix", "v2/video_generation", "Bearer sk-video-1x", 401},
		{"not bearer", "v2/video_generation", "Basic sk-video-1", 401},
		{"hostile key in other case", "v2/video_generation", "Bearer " + strings.ToLower(hostile), 401},
		{"first key", "v2/video_generation", "Bearer sk-video-1", 200},
		{"hostile key", "v2/video_generation", "Bearer " + hostile, 200},
		{"public download", "v2/video_generation/3f1c/content", "", 200},
		{"public prefix only", "v2/video_generation/3f1c/content/x", "", 401},
	} {
		before := be.hits.Load()
		hdr := map[string]string{}
		if tc.auth != "" {
			hdr["Authorization"] = tc.auth
		}
		code, _, h := do(t, nil, "GET", url+tc.path, hdr, "")
		if code != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, code, tc.want)
		}
		if tc.want == 401 {
			if got := h.Get("WWW-Authenticate"); got != "Bearer" {
				t.Errorf("%s: WWW-Authenticate %q", tc.name, got)
			}
			if be.hits.Load() != before {
				t.Errorf("%s: a refused request reached the backend", tc.name)
			}
		}
	}

	code, body, _ := do(t, nil, "GET", url+"v2/video_generation/3f1c/content", map[string]string{
		"Range": "bytes=100-199", "X-Forwarded-Proto": "https",
	}, "")
	if code != 206 || body != string(payload[100:200]) {
		t.Errorf("Range: %d, %d bytes", code, len(body))
	}
	r := be.last()
	if r.URL.Path != "/v2/video_generation/3f1c/content" || r.Header.Get("X-Forwarded-Proto") != "https" ||
		r.Header.Get("X-Forwarded-Host") != "127.0.0.1" || r.Header.Get("X-Real-IP") != "127.0.0.1" {
		t.Errorf("backend saw path %q, headers %v", r.URL.Path, r.Header)
	}
	do(t, nil, "GET", url+"v2/video_generation/3f1c/content", nil, "")
	if got := be.last().Header.Get("X-Forwarded-Proto"); got != "http" {
		t.Errorf("X-Forwarded-Proto without a client value: %q, want http", got)
	}
}

// TestNginxVideoRateLimit: rate_limit slows a large download (even when
// the backend asks for no buffering), without it the download runs at full
// speed; Range works with both. A behaviour check with generous bounds,
// not a performance assertion.
func TestNginxVideoRateLimit(t *testing.T) {
	n := startNginx(t)
	const size = 4 << 20
	payload := bytes.Repeat([]byte{'v'}, size)
	be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Accel-Buffering", "no")
		http.ServeContent(w, r, "clip.mp4", time.Unix(0, 0), bytes.NewReader(payload))
	})
	snap := Snapshot{Backends: []Endpoint{be.endpoint(t)}}
	// 8Mbps = 1,000,000 bytes/s after the first 1m.
	install(t, n, videoRoute("slow", map[string]string{"rate_limit": "8Mbps"}, backendTier), snap)
	install(t, n, videoRoute("fast", nil, backendTier), snap)

	rate := func(route string) float64 {
		start := time.Now()
		code, body, _ := do(t, nil, "GET", n.URL(route)+"v2/video_generation/x/content", nil, "")
		elapsed := time.Since(start).Seconds()
		if code != 200 || len(body) != size {
			t.Fatalf("%s: %d, %d bytes", route, code, len(body))
		}
		r := float64(size) / elapsed
		t.Logf("%s: %d bytes in %.3fs = %.0f bytes/s", route, size, elapsed, r)
		return r
	}
	slow, fast := rate("slow"), rate("fast")
	// Limit 1e6 B/s; 1 MiB limit_rate_after and nginx's first-second burst
	// let the average reach ≈1.5e6. 3e6 leaves a wide margin.
	if slow > 3e6 {
		t.Errorf("rate_limit 8Mbps: download ran at %.0f bytes/s", slow)
	}
	if fast < 2*slow {
		t.Errorf("without rate_limit the download ran at %.0f bytes/s, not clearly faster than the limited %.0f", fast, slow)
	}
	for _, route := range []string{"slow", "fast"} {
		code, body, _ := do(t, nil, "GET", n.URL(route)+"v2/x", map[string]string{"Range": "bytes=10-19"}, "")
		if code != 206 || len(body) != 10 {
			t.Errorf("%s Range: %d, %d bytes", route, code, len(body))
		}
	}
}

// clientFrom returns a client whose connections come from a loopback
// source address, so the dispatch server's X-Real-IP differs per client.
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// TestNginxVideoClientLimits: limit_conn and limit_req count per client IP
// (X-Real-IP from the dispatch server), not globally: the route server
// itself sees every request from "unix:".
func TestNginxVideoClientLimits(t *testing.T) {
	n := startNginx(t)
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			arrived <- struct{}{}
			<-release
		}
		io.WriteString(w, "ok")
	})
	snap := Snapshot{Backends: []Endpoint{be.endpoint(t)}}
	install(t, n, videoRoute("conn", map[string]string{"upload_conn_limit": "1"}, backendTier), snap)
	install(t, n, videoRoute("req", map[string]string{"upload_req_limit": "1r/m"}, backendTier), snap)
	c2, c3 := clientFrom("127.0.0.2"), clientFrom("127.0.0.3")

	held := make(chan int, 1)
	go func() {
		resp, err := c2.Get(n.URL("conn") + "slow")
		if err != nil {
			held <- -1
			return
		}
		resp.Body.Close()
		held <- resp.StatusCode
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	select {
	case <-arrived:
	case <-ctx.Done():
		t.Fatal("held request never reached the backend")
	}
	if code, _, _ := do(t, c2, "GET", n.URL("conn")+"fast", nil, ""); code != 503 {
		t.Errorf("second connection from 127.0.0.2: %d, want 503", code)
	}
	if code, _, _ := do(t, c3, "GET", n.URL("conn")+"fast", nil, ""); code != 200 {
		t.Errorf("connection from 127.0.0.3: %d, want 200 (limit is per client)", code)
	}
	close(release)
	if code := <-held; code != 200 {
		t.Errorf("held request: %d", code)
	}
	if code, _, _ := do(t, c2, "GET", n.URL("conn")+"fast", nil, ""); code != 200 {
		t.Errorf("127.0.0.2 after its request ended: %d, want 200", code)
	}

	for _, step := range []struct {
		c    *http.Client
		who  string
		want int
	}{{c2, "127.0.0.2 first", 200}, {c2, "127.0.0.2 second", 503}, {c3, "127.0.0.3 first", 200}} {
		if code, _, _ := do(t, step.c, "GET", n.URL("req")+"x", nil, ""); code != step.want {
			t.Errorf("limit_req %s: %d, want %d", step.who, code, step.want)
		}
	}
}
