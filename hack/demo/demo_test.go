package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/charttest"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// TestDemo runs the whole demo without pauses: the real apiserver, the real
// controller and reload binaries and a real nginx (required here: a
// missing nginx fails the test instead of skipping the data plane).
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts a control plane; run without -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var out bytes.Buffer
	read, err := charttest.MetricsRead(testbin.Root(t))
	if err != nil {
		t.Fatal(err)
	}
	scraped := map[string]bool{}
	// The chart's alerts and dashboard read only metrics the real
	// binaries serve: each name is in a scrape of its binary's /metrics
	// once the demo's scenes have run (hagate's are checked by
	// cmd/hagate's tests).
	converged := func(urls map[string]string) error {
		for bin, url := range urls {
			body, err := scrape(url)
			if err != nil {
				return err
			}
			owned, missing := charttest.ScrapeLacks(read, bin, body)
			if len(missing) > 0 {
				t.Errorf("a scrape of %s (%s) lacks %v, which the chart's rules or dashboard read", bin, url, missing)
			}
			scraped[bin] = owned > 0
		}
		return nil
	}
	err = run(ctx, &out, options{Nginx: "on", Timeout: 90 * time.Second, Converged: converged})
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatalf("demo: %v", err)
	}
	if !scraped["autoconfig"] || !scraped["reload"] {
		t.Errorf("scraped %v; want the controller's and reload's metrics checked", scraped)
	}
	for _, want := range []string{
		"served by video-1, video-2 (",
		"served by video-1, video-2, video-3, video-4 (",
		"served by video-1 (",
		"the last good backend list stays",
		"llm requests served by qwen-1, qwen-2 (",
		"llm requests served by qwen-1, qwen-2, qwen-3, qwen-4 (",
		"with qwen-2 refusing → llm requests served by qwen-1, qwen-3, qwen-4, 0 client failures",
		"llm requests served by qwen-1 (",
		"0 sessions changed version; 0 requests failed",
		"of later turns on their pod; TTFT p50 turn 1 ",
		"admitted streams decode at a median ",
		"route chat deleted: its keys left",
		"done: every scene converged",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	// The route table shows which consumer pods serve the llm route's
	// current file: nginx (openresty-0) does, once its sidecar reloaded.
	if !regexp.MustCompile(`(?m)NAME\s+BACKENDS\s+CART\s+CANARY\s+READY\s+SYNCED`).MatchString(out.String()) ||
		!regexp.MustCompile(`(?m)`+llmRoute+`\s+\d+\s+\d+\s+True\s+1/1\s`).MatchString(out.String()) {
		t.Errorf("the route table does not show the llm route SYNCED 1/1")
	}
	// The canary scene: the table shows the weight, and the sessions
	// split about 10 % to the canary without changing version.
	if !regexp.MustCompile(`(?m)` + llmRoute + `\s+\d+\s+\d+\s+10\s+True\s+1/1\s`).MatchString(out.String()) {
		t.Errorf("the route table does not show the llm route's canary weight 10")
	}
	if m := regexp.MustCompile(`through nginx: (\d+) sessions on the canary`).FindStringSubmatch(out.String()); m == nil {
		t.Errorf("the canary scene sent no sessions")
	} else if n, _ := strconv.Atoi(m[1]); n < canarySessions*canaryWeight/100/2 || n > canarySessions*canaryWeight/100*2 {
		t.Errorf("%d of %d sessions on the canary at weight %d", n, canarySessions, canaryWeight)
	}

	// The llm engine scene: later turns stay on their session's pod and
	// are cheaper than the cold first turn; under the burst the admitted
	// streams keep about the SLO and the excess is refused.
	if m := regexp.MustCompile(`: (\d+) % of later turns on their pod; TTFT p50 turn 1 (\d+) ms, later turns (\d+) ms`).FindStringSubmatch(out.String()); m == nil {
		t.Errorf("the engine scene printed no session line")
	} else {
		share, _ := strconv.Atoi(m[1])
		cold, _ := strconv.Atoi(m[2])
		warm, _ := strconv.Atoi(m[3])
		if share < 90 || warm >= cold {
			t.Errorf("sessions: %d %% of later turns on their pod, TTFT p50 cold %d ms, warm %d ms; want ≥ 90 %% and warm below cold", share, cold, warm)
		}
	}
	if m := regexp.MustCompile(`admitted streams decode at a median ([\d.]+) tokens/s \(SLO (\d+)\); ([\d,]+) refused`).FindStringSubmatch(out.String()); m == nil {
		t.Errorf("the engine scene printed no burst line")
	} else {
		median, _ := strconv.ParseFloat(m[1], 64)
		slo, _ := strconv.ParseFloat(m[2], 64)
		refused, _ := strconv.Atoi(strings.ReplaceAll(m[3], ",", ""))
		if median < 0.85*slo || refused == 0 {
			t.Errorf("burst: admitted streams' median %.1f tokens/s (SLO %.0f), %d refused; want ≥ 85 %% of the SLO and the excess refused", median, slo, refused)
		}
	}
}

func scrape(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestLineDiff(t *testing.T) {
	removed, added := lineDiff([]string{"a", "b", "b", "c"}, []string{"b", "c", "d"})
	if strings.Join(removed, ",") != "a,b" || strings.Join(added, ",") != "d" {
		t.Fatalf("lineDiff = -%v +%v, want -[a b] +[d]", removed, added)
	}
}
