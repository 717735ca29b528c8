package readyz

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/readiness"
)

func fixture(name string) string { return filepath.Join("..", "..", "testdata", "proc", name) }

// newTestServer serves the real mux over HTTP for a detector on a fixture.
func newTestServer(t *testing.T, procRoot string, ports ...int) *httptest.Server {
	t.Helper()
	d, err := readiness.NewDetector(readiness.Options{ProcRoot: procRoot, Ports: ports, TTL: time.Nanosecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	reg, m := newRegistry(d)
	srv := httptest.NewServer(newMux(d, reg, m))
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, method, url string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

func TestReadyzThroughMux(t *testing.T) {
	for _, tc := range []struct {
		name  string
		root  string
		ports []int
		code  int
		body  string
	}{
		{name: "present", root: "listen-tcp", ports: []int{15008}, code: 200, body: `{"status":"ready"}`},
		{name: "present tcp6", root: "listen-tcp6", ports: []int{15008}, code: 200, body: `{"status":"ready"}`},
		{name: "established only", root: "established", ports: []int{15008}, code: 503, body: `{"status":"not ready","missingListeners":[15008]}`},
		{name: "two missing in order", root: "other-port", ports: []int{15008, 9999, 8080}, code: 503, body: `{"status":"not ready","missingListeners":[15008,9999]}`},
		{name: "no ports", root: "established", code: 200, body: `{"status":"ready"}`},
		{name: "fail open", root: "unreadable-tcp", ports: []int{15008}, code: 200, body: `{"status":"ready"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newTestServer(t, fixture(tc.root), tc.ports...)
			code, body, h := get(t, http.MethodGet, srv.URL+"/readyz")
			if code != tc.code || strings.TrimSpace(body) != tc.body {
				t.Errorf("GET /readyz = %d %s, want %d %s", code, body, tc.code, tc.body)
			}
			if ct := h.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			// Liveness never depends on the listeners.
			for _, p := range []string{"/health", "/healthz"} {
				if code, body, _ := get(t, http.MethodGet, srv.URL+p); code != 200 {
					t.Errorf("GET %s = %d %s, want 200", p, code, body)
				}
			}
			if code, _, _ := get(t, http.MethodHead, srv.URL+"/readyz"); code != tc.code {
				t.Errorf("HEAD /readyz = %d, want %d", code, tc.code)
			}
		})
	}
}

func TestWrongMethod(t *testing.T) {
	srv := newTestServer(t, fixture("listen-tcp"), 15008)
	for _, p := range []string{"/readyz", "/health", "/healthz", "/metrics"} {
		for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
			code, _, h := get(t, m, srv.URL+p)
			if code != http.StatusMethodNotAllowed {
				t.Errorf("%s %s = %d, want 405", m, p, code)
			}
			if !strings.Contains(h.Get("Allow"), "GET") {
				t.Errorf("%s %s: Allow %q", m, p, h.Get("Allow"))
			}
		}
	}
	if code, _, _ := get(t, http.MethodGet, srv.URL+"/nope"); code != http.StatusNotFound {
		t.Errorf("GET /nope = %d, want 404", code)
	}
}

func TestMetrics(t *testing.T) {
	srv := newTestServer(t, fixture("established"), 15008)
	for range 3 {
		get(t, http.MethodGet, srv.URL+"/readyz")
	}
	_, body, _ := get(t, http.MethodGet, srv.URL+"/metrics")
	for _, want := range []string{
		`autoconfig_readyz_requests_total{code="503"} 3`,
		`autoconfig_readyz_scans_total 3`, // TTL of 1ns: every call rescans
		`autoconfig_readyz_ready 0`,
		`autoconfig_readyz_enforced 1`,
		`autoconfig_readyz_missing_listeners 1`,
		`autoconfig_readyz_required_listeners 1`,
		`# TYPE go_goroutines gauge`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The JSON of the readiness answer is stable for probes and tools.
	_, rb, _ := get(t, http.MethodGet, srv.URL+"/readyz")
	var v map[string]any
	if err := json.Unmarshal([]byte(rb), &v); err != nil || v["status"] != "not ready" {
		t.Errorf("readyz body %q: %v", rb, err)
	}
}
