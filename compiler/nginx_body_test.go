package compiler

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
)

// multimodalBody is a chat request of about size bytes: a system prompt
// and a user message whose parts carry a base64 "image" (the shape of the
// multimodal requests that outgrow nginx's default 1 MiB body limit).
func multimodalBody(size int, seed byte) []byte {
	raw := bytes.Repeat([]byte{seed, 0x5a, 0xa5}, size*3/4/3+1)
	img := base64.StdEncoding.EncodeToString(raw)[:size-200]
	return []byte(`{"model":"m","messages":[{"role":"system","content":"You look at images."},` +
		`{"role":"user","content":[{"type":"text","text":"What is in it?"},` +
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,` + img + `"}}]}]}`)
}

// TestNginxLargeBody: an llm route's server takes request bodies larger
// than nginx's default client_max_body_size (1 MiB): the shipped
// nginx.conf's http{} level sets 64m, which every route server inherits
// (route files set none, so they are byte-identical to before). A 1.5 MB
// and a 3 MB body, with Content-Length and chunked, reach the backend whole
// and are answered 200 (before: 413 from the route's server, the backend
// never saw them); a body above 64 MiB is still refused 413.
func TestNginxLargeBody(t *testing.T) {
	var mu sync.Mutex
	got := map[[32]byte]bool{}
	be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(500)
			return
		}
		mu.Lock()
		got[sha256.Sum256(b)] = true
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","choices":[{"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	})
	n := nginxtest.Start(t, nginxtest.Options{Reference: true, Workers: 2})
	route := llmRoute("big", nil, backendTier)
	install(t, n, route, Snapshot{Backends: []Endpoint{be.endpoint(t)}})
	url := n.URL("big") + "v1/chat/completions"
	c := &http.Client{Timeout: 60 * time.Second}
	t.Cleanup(c.CloseIdleConnections)

	post := func(body []byte, chunked bool) int {
		t.Helper()
		var rd io.Reader = bytes.NewReader(body)
		if chunked {
			rd = io.MultiReader(rd) // no length known: chunked
		}
		req, err := http.NewRequest("POST", url, rd)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if chunked != (req.ContentLength <= 0) {
			t.Fatalf("request framing: chunked %v, Content-Length %d", chunked, req.ContentLength)
		}
		return resp.StatusCode
	}
	for i, size := range []int{1_500_000, 3_000_000, 16 << 20} {
		for _, chunked := range []bool{false, true} {
			body := multimodalBody(size, byte(2*i+map[bool]int{false: 0, true: 1}[chunked]))
			if code := post(body, chunked); code != 200 {
				t.Fatalf("%d bytes (chunked %v): status %d, want 200\n%s", len(body), chunked, code, n.ErrorLog())
			}
			mu.Lock()
			ok := got[sha256.Sum256(body)]
			mu.Unlock()
			if !ok {
				t.Fatalf("%d bytes (chunked %v): the backend did not get the body whole", len(body), chunked)
			}
		}
	}
	// A body over client_body_buffer_size is spooled to a file, and the
	// engine reads its key from there when affinity_body_max_bytes allows:
	// both 3 MB requests are placed by their key (home), none keyless.
	be2 := newBackend(t, be.Config.Handler.ServeHTTP)
	keyed := llmRoute("bigkey", map[string]string{"affinity_body_max_bytes": "8388608"}, backendTier)
	install(t, n, keyed, Snapshot{Backends: []Endpoint{be.endpoint(t), be2.endpoint(t)}})
	url = n.URL("bigkey") + "v1/chat/completions"
	for _, chunked := range []bool{false, true} {
		if code := post(multimodalBody(3_000_000, 9), chunked); code != 200 {
			t.Fatalf("bigkey, chunked %v: status %d", chunked, code)
		}
	}
	fams := scrapeCounted(t, n, "bigkey", 2)
	home := sum(fams, "autoconfig_engine_affinity_placements_total", map[string]string{"route": "bigkey", "result": "home"})
	keyless := sum(fams, "autoconfig_engine_affinity_placements_total", map[string]string{"route": "bigkey", "result": "keyless"})
	if home != 2 || keyless != 0 {
		t.Fatalf("spooled 3 MB bodies: %v home, %v keyless placements, want 2 and 0", home, keyless)
	}
	url = n.URL("big") + "v1/chat/completions"

	// The bound stays: a body over 64 MiB is refused by nginx.
	huge := []byte(`{"prompt":"` + strings.Repeat("a", 64<<20) + `"}`)
	if code := post(huge, false); code != 413 {
		t.Fatalf("a %d-byte body: status %d, want 413", len(huge), code)
	}
}
