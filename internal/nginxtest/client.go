package nginxtest

// This file: the HTTP clients of the tests (a GET, the engine's status
// endpoints, a timed chat request).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Get fetches url and returns the status code and body; a transport error
// fails the test.
func Get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// GetJSON fetches url within ctx (and 5 s) and decodes the JSON body of
// its 200 answer into v: the reference engine's status endpoints
// (/<route>/_status, /<route>/_tps_status; in-pod callers only, which a
// client on 127.0.0.1 is).
func GetJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

// TPSStatus is the reference engine's GET /<route>/_tps_status: the
// route's decode-SLO admission state.
type TPSStatus struct {
	Route        string  `json:"route"`
	OptIn        bool    `json:"opt_in"`
	AdaptiveCCOn bool    `json:"adaptive_cc_on"`
	TPSLimit     float64 `json:"tps_limit_tps"`
	Peers        []struct {
		Host          string   `json:"host"`
		Port          int      `json:"port"`
		Limit         *float64 `json:"limit"`
		InFlight      int      `json:"in_flight"`
		DecodeTPSEWMA *float64 `json:"decode_tps_ewma"`
		TTFTMsEWMA    *float64 `json:"ttft_ms_ewma"`
	} `json:"peers"`
}

// Reply is one request's outcome, for tests that time answers (a held
// request, a refusal).
type Reply struct {
	Code       int
	Body       string // trimmed
	RetryAfter string // the Retry-After header
	Sent, Done time.Time
	Err        error
}

// PostChat sends one OpenAI chat completion to url (a route's URL, e.g.
// n.URL("qwen")) and returns how it was answered; it waits up to a
// minute.
func PostChat(url string) Reply {
	a := Reply{Sent: time.Now()}
	resp, err := (&http.Client{Timeout: time.Minute}).Post(url+"v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"qwen","messages":[{"role":"user","content":"hi"}]}`))
	a.Done = time.Now()
	if err != nil {
		a.Err = err
		return a
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a.Code, a.Body, a.RetryAfter = resp.StatusCode, strings.TrimSpace(string(b)), resp.Header.Get("Retry-After")
	return a
}
