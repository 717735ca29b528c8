package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/modelsphere/autoconfig/internal/llmsim"
	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// The overload scenario: more clients than the pods can serve at the
// route's decode SLO, with the engine's adaptive concurrency (every
// stream admitted keeps the SLO, the rest are refused at once) and
// without it (every stream admitted, all of them slower).

// overloadVariant is one admission policy's measurement.
type overloadVariant struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Admitted are the streams started in the measured window and
	// answered 200; Completed those of them that ended with [DONE].
	Admitted  int `json:"admitted"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	// DecodeP50 and DecodeP10 are the admitted streams' decode rates
	// (llmsim Result.DecodeRate), tokens/s.
	DecodeP50 float64 `json:"decode_tps_p50"`
	DecodeP10 float64 `json:"decode_tps_p10"`
	TTFTP50   float64 `json:"ttft_p50_ms"`
	// Delivered is the tokens the pods sent in the window per second;
	// DeliveredPct its share of the pods' capacity.
	Delivered    float64 `json:"delivered_tps"`
	Capacity     float64 `json:"capacity_tps"`
	DeliveredPct float64 `json:"delivered_pct"`
	Refusals     int     `json:"refusals"`
	RefusalP50   float64 `json:"refusal_p50_ms"`
	RefusalP99   float64 `json:"refusal_p99_ms"`
	// RetryAfter is whether every refusal carried Retry-After: 1.
	RetryAfter bool `json:"refusals_retry_after_1"`
	// Limits are the peers' concurrency limits the engine held at the end
	// of the window (nil: no limit); LimitMin and LimitMax the range of
	// every peer's limit sampled each second of the window.
	Limits   []*float64 `json:"limits_at_end"`
	LimitMin *float64   `json:"limit_min,omitempty"`
	LimitMax *float64   `json:"limit_max,omitempty"`
	// StreamsPerPod is the mean number of streams a pod decoded at once,
	// sampled each second of the window.
	StreamsPerPod float64 `json:"streams_per_pod"`
}

type overloadResult struct {
	Pods         int               `json:"pods"`
	PodTPS       float64           `json:"pod_decode_tps"`
	SLOTPS       int32             `json:"slo_decode_tps"`
	Clients      int               `json:"clients"`
	MaxTokens    int               `json:"max_tokens"`
	WarmupSecs   float64           `json:"warmup_seconds"`
	WindowSecs   float64           `json:"window_seconds"`
	RefusalPause float64           `json:"refusal_pause_ms"`
	Variants     []overloadVariant `json:"variants"`
}

// refusalPause is how long a refused client waits before its next request.
const refusalPause = 100 * time.Millisecond

func runOverload(g *rig, o *options) (*overloadResult, error) {
	res := &overloadResult{
		Pods: o.OverloadPods, PodTPS: o.PodTPS, SLOTPS: int32(o.SLOTPS), Clients: o.Clients,
		MaxTokens: o.StreamTokens, WarmupSecs: o.Warmup.Seconds(), WindowSecs: o.Window.Seconds(),
		RefusalPause: ms(refusalPause),
	}
	for _, v := range []struct {
		name, desc string
		values     map[string]string
	}{
		{"adaptive", fmt.Sprintf("spec.slo.decodeTokensPerSecond %d, adaptive concurrency", o.SLOTPS), nil},
		{"static", "the same SLO with adaptive_cc \"false\" (every request admitted)", map[string]string{"adaptive_cc": "false"}},
	} {
		logf("overload: %s (%s), %s warm-up + %s", v.name, v.desc, o.Warmup, o.Window)
		ov, err := overloadRun(g, o, "over-"+v.name, v.values)
		if err != nil {
			return res, fmt.Errorf("overload %s: %w", v.name, err)
		}
		ov.Name, ov.Description = v.name, v.desc
		res.Variants = append(res.Variants, ov)
	}
	return res, nil
}

func overloadRun(g *rig, o *options, name string, values map[string]string) (overloadVariant, error) {
	var ov overloadVariant
	pods, err := llmsim.StartPods(o.OverloadPods, llmsim.Config{DecodeTokensPerSecond: o.PodTPS})
	if err != nil {
		return ov, err
	}
	defer pods.Close()
	route := llmRoute(name, values, &routespec.SLO{DecodeTokensPerSecond: int32(o.SLOTPS)})
	if err := g.install(route, podEndpoints(pods)); err != nil {
		return ov, err
	}
	defer g.removeRoute(route)
	client := newClient(2 * o.Clients)
	defer client.CloseIdleConnections()
	url := g.chatURL(route)

	begin := time.Now()
	t0, t1 := begin.Add(o.Warmup), begin.Add(o.Warmup+o.Window)
	var mu sync.Mutex
	var rates []float64
	var ttfts, refusals []time.Duration
	retryAfter := true
	var firstErr error
	var wg sync.WaitGroup
	for c := range o.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				start := time.Now()
				if !start.Before(t1) {
					return
				}
				req := llmsim.ChatRequest{
					Messages:  []llmsim.Message{{Role: "user", Content: "client " + strconv.Itoa(c) + " request " + strconv.Itoa(k)}},
					MaxTokens: o.StreamTokens,
					Stream:    true,
				}
				r := llmsim.Chat(context.Background(), client, url, req, nil)
				measured := !start.Before(t0)
				if r.Status == http.StatusServiceUnavailable {
					if measured {
						mu.Lock()
						refusals = append(refusals, r.Duration)
						retryAfter = retryAfter && r.Header.Get("Retry-After") == "1"
						mu.Unlock()
					}
					time.Sleep(refusalPause)
					continue
				}
				if !measured {
					continue
				}
				mu.Lock()
				switch {
				case r.Status != http.StatusOK:
					ov.Failed++
					if firstErr == nil {
						firstErr = fmt.Errorf("status %d: %v", r.Status, r.Err)
					}
				default:
					ov.Admitted++
					if r.Err == nil {
						ov.Completed++
						rates = append(rates, r.DecodeRate)
						ttfts = append(ttfts, r.TTFT)
					} else {
						ov.Failed++
						if firstErr == nil {
							firstErr = r.Err
						}
					}
				}
				mu.Unlock()
				if r.Status != http.StatusOK {
					time.Sleep(refusalPause)
				}
			}
		}()
	}

	// The window: the pods' decoded tokens at its start and end, and the
	// engine's limits and the pods' streams every second.
	time.Sleep(time.Until(t0))
	tokens0, at0 := decoded(pods), time.Now()
	var samples, active int
	lmin, lmax := math.Inf(1), math.Inf(-1)
	var st nginxtest.TPSStatus
	for next := t0.Add(time.Second); ; next = next.Add(time.Second) {
		if next.After(t1) {
			next = t1
		}
		time.Sleep(time.Until(next))
		for _, s := range pods.Stats() {
			active += s.Active
		}
		samples++
		var e error
		if st, e = g.tpsStatusOf(route); e != nil && err == nil {
			err = e
		}
		for _, p := range st.Peers {
			if p.Limit != nil {
				lmin, lmax = math.Min(lmin, *p.Limit), math.Max(lmax, *p.Limit)
			}
		}
		if !next.Before(t1) {
			break
		}
	}
	tokens1, at1 := decoded(pods), time.Now()
	for _, p := range st.Peers {
		ov.Limits = append(ov.Limits, p.Limit)
	}
	if !math.IsInf(lmin, 1) {
		ov.LimitMin, ov.LimitMax = &lmin, &lmax
	}
	wg.Wait()
	if err != nil {
		return ov, err
	}

	ov.Capacity = float64(len(pods)) * o.PodTPS
	ov.Delivered = float64(tokens1-tokens0) / at1.Sub(at0).Seconds()
	ov.DeliveredPct = 100 * ov.Delivered / ov.Capacity
	ov.StreamsPerPod = float64(active) / float64(samples*len(pods))
	ov.DecodeP50 = llmsim.PercentileFloat(rates, 0.5)
	ov.DecodeP10 = llmsim.PercentileFloat(rates, 0.1)
	ov.TTFTP50 = ms(llmsim.Percentile(ttfts, 0.5))
	ov.Refusals = len(refusals)
	ov.RefusalP50 = ms(llmsim.Percentile(refusals, 0.5))
	ov.RefusalP99 = ms(llmsim.Percentile(refusals, 0.99))
	ov.RetryAfter = retryAfter
	if firstErr != nil {
		logf("overload %s: %d requests failed, the first: %v", name, ov.Failed, firstErr)
	}
	return ov, nil
}

// decoded is the tokens the pods have sent.
func decoded(pods llmsim.Pods) int {
	n := 0
	for _, s := range pods.Stats() {
		n += s.DecodedTokens
	}
	return n
}
