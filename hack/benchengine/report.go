package main

import (
	"fmt"
	"io"
	"strings"
)

// goal is one target a measurement is held against.
type goal struct {
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
}

// goals are the targets of the scenarios that ran.
func goals(r *report) []goal {
	var out []goal
	add := func(name string, met bool, format string, args ...any) {
		out = append(out, goal{Goal: name, Measured: fmt.Sprintf(format, args...), Met: met})
	}
	if s := r.Sessions; s != nil {
		for _, v := range s.Variants {
			if v.Name == "off" {
				continue
			}
			add(fmt.Sprintf("≥ 95 %% of later turns on the previous turn's pod (affinity %s)", v.Name),
				v.StayedPct >= 95 && v.Failed == 0, "%.1f %% (%d failed)", v.StayedPct, v.Failed)
		}
		if d := s.Disruption; d != nil {
			limit := 100/float64(d.Pods) + 2
			name := fmt.Sprintf("removing one pod of %d moves ≤ 1/%d + 2 %% = %.1f %% of the session keys", d.Pods, d.Pods, limit)
			h := d.Removals[0]
			add(name, h.MovedPct <= limit && h.FromOthers == 0 && d.Failed == 0,
				"%s removed: %.1f %% moved, %s; each pod removed in turn: mean %.1f %%, range %.1f–%.1f %% (the pods' shares of %d keys), %s",
				h.Pod, h.MovedPct, yesNo(h.FromOthers == 0, "all of them from it", "some from other pods"),
				d.MeanMovedPct, d.MinMovedPct, d.MaxMovedPct, d.Keys,
				yesNo(d.AllMovedOnRemoved, "every moved key from the removed pod", "NOT every moved key from the removed pod"))
		}
	}
	if o := r.Overload; o != nil {
		for _, v := range o.Variants {
			if v.Name != "adaptive" {
				continue
			}
			x := float64(o.Clients) * float64(o.SLOTPS) / (float64(o.Pods) * o.PodTPS)
			add(fmt.Sprintf("at %.0f× overload with a %d tokens/s SLO, admitted streams decode at a median ≥ %.0f tokens/s", x, o.SLOTPS, 0.9*float64(o.SLOTPS)),
				v.DecodeP50 >= 0.9*float64(o.SLOTPS), "%.1f tokens/s (p10 %.1f)", v.DecodeP50, v.DecodeP10)
			add("delivered tokens ≥ 80 % of the pods' capacity", v.DeliveredPct >= 80,
				"%.1f %% (%.0f of %.0f tokens/s)", v.DeliveredPct, v.Delivered, v.Capacity)
			add("refusals ≤ 300 ms at p99", v.Refusals == 0 || v.RefusalP99 <= 300,
				"p99 %.1f ms (%d refusals)", v.RefusalP99, v.Refusals)
		}
	}
	if c := r.Cost; c != nil {
		small, big := c.Routes[1], c.Routes[len(c.Routes)-1]
		x, k := worst(c.P50.EngineOverPlain)
		add(fmt.Sprintf("engine (%s peers) ≤ 1.5× plain proxy_pass per request (median)", strings.TrimPrefix(small, "engine-")), x > 0 && x <= 1.5,
			"%.2f× at worst (%s); %s. Rounds' means: %s; nginx CPU: %s", x, k, ratios(c.P50.EngineOverPlain), ratios(c.RoundMeans.EngineOverPlain), ratios(c.CPU.EngineOverPlain))
		x, k = worst(c.P50.BigOverSmall)
		add(fmt.Sprintf("a %s-peer tier ≤ 1.2× a %s-peer tier per request (median)", strings.TrimPrefix(big, "engine-"), strings.TrimPrefix(small, "engine-")), x > 0 && x <= 1.2,
			"%.2f× at worst (%s); %s. Rounds' means: %s; nginx CPU: %s", x, k, ratios(c.P50.BigOverSmall), ratios(c.RoundMeans.BigOverSmall), ratios(c.CPU.BigOverSmall))
	}
	return out
}

// worst is the greatest ratio of m and its kind.
func worst(m map[string]float64) (float64, string) {
	x, kind := 0.0, ""
	for _, k := range costKinds {
		if m[k] > x {
			x, kind = m[k], k
		}
	}
	return x, kind
}

func ratios(m map[string]float64) string {
	var parts []string
	for _, k := range costKinds {
		if x, ok := m[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f×", k, x))
		}
	}
	return strings.Join(parts, ", ")
}

func yesNo(b bool, yes, no string) string {
	if b {
		return yes
	}
	return no
}

// writeReport prints the report as markdown.
func writeReport(w io.Writer, r *report, o *options) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("# benchengine: the llm engine (deploy/openresty, router*.lua)")
	p("")
	p("- command: `%s`", r.Command)
	p("- CPUs: %d; nginx workers: %d; started %s; took %.0f s", r.CPUs, r.Workers, r.Started.Format("2006-01-02 15:04:05"), r.Seconds)
	p("- engine: %s", r.Engine)
	p("- load average (1 min) at the start %s, at the end %s (other work on the machine moves the numbers, the cost scenario's most)", r.LoadStart, r.LoadEnd)
	if s := r.Sessions; s != nil {
		p("")
		p("## sessions")
		p("")
		p("%d conversations × %d turns, %d at once, %d pods (decode %.0f, prefill %.0f tokens/s); a %d-byte system prompt per group of %d conversations.",
			o.Conversations, o.TurnsPerConv, s.Concurrency, s.Pods, sessionPods.DecodeTokensPerSecond, sessionPods.PrefillTokensPerSecond, systemPromptBytes, convsPerGroup)
		p("")
		p("| placement | later turns on the previous pod | TTFT p50 turns 2–%d | TTFT p99 turns 2–%d | TTFT p50 turn 1 | prompt tokens cached | failed | s |", o.TurnsPerConv, o.TurnsPerConv)
		p("|---|---|---|---|---|---|---|---|")
		for _, v := range s.Variants {
			p("| %s: %s | %.1f %% (%d of %d) | %.1f ms | %.1f ms | %.1f ms | %.1f %% | %d | %.1f |",
				v.Name, v.Description, v.StayedPct, v.Stayed, v.LaterTurns, v.LaterTTFTP50, v.LaterTTFTP99, v.FirstTTFTP50, v.CachedPct, v.Failed, v.Seconds)
		}
		if d := s.Disruption; d != nil {
			p("")
			p("Minimal disruption (affinity on): %d session keys, one request each (%d at once), placed on %d pods; then each pod in turn leaves the route "+
				"(re-render, reload), the keys are placed again, the pod comes back (re-render, reload) and they are placed a third time.", d.Keys, placeWorkers, d.Pods)
			p("")
			p("| pod removed | keys it held | keys moved | moved from other pods | moved keys back after the re-add | all keys on their first pod after it |")
			p("|---|---|---|---|---|---|")
			for _, rm := range d.Removals {
				p("| %s | %d (%.1f %%) | %d (%.1f %%) | %d | %d of %d | %d of %d |", rm.Pod, rm.Held, rm.HeldPct, rm.Moved, rm.MovedPct, rm.FromOthers, rm.Returned, rm.Moved, rm.Back, d.Keys)
			}
			p("")
			p("Moved: **mean %.1f %%** (%.1f–%.1f %%); %s; %.1f %% of the moved keys returned. Failed requests: %d.",
				d.MeanMovedPct, d.MinMovedPct, d.MaxMovedPct,
				yesNo(d.AllMovedOnRemoved, "every moved key was on the removed pod", "NOT every moved key was on the removed pod"), d.ReturnedPct, d.Failed)
		}
	}
	if ov := r.Overload; ov != nil {
		p("")
		p("## overload")
		p("")
		p("%d pods of %.0f tokens/s, %d clients looping streamed requests of %d tokens (a refused one waits %.0f ms); %.0f s warm-up, then %.0f s measured. SLO %d tokens/s per stream (%.0f streams in all).",
			ov.Pods, ov.PodTPS, ov.Clients, ov.MaxTokens, ov.RefusalPause, ov.WarmupSecs, ov.WindowSecs, ov.SLOTPS, float64(ov.Pods)*ov.PodTPS/float64(ov.SLOTPS))
		p("")
		p("| admission | admitted streams | decode p50 | decode p10 | TTFT p50 | delivered | refusals | refusal p50 | refusal p99 | limits at the end (range) | streams per pod | failed |")
		p("|---|---|---|---|---|---|---|---|---|---|---|---|")
		for _, v := range ov.Variants {
			p("| %s: %s | %d | %.1f tok/s | %.1f tok/s | %.1f ms | %.1f %% (%.0f tok/s) | %d%s | %.1f ms | %.1f ms | %s | %.1f | %d |",
				v.Name, v.Description, v.Admitted, v.DecodeP50, v.DecodeP10, v.TTFTP50, v.DeliveredPct, v.Delivered,
				v.Refusals, yesNo(v.Refusals == 0 || v.RetryAfter, "", " (not all Retry-After: 1)"), v.RefusalP50, v.RefusalP99, limits(v), v.StreamsPerPod, v.Failed)
		}
	}
	if c := r.Cost; c != nil {
		p("")
		p("## cost")
		p("")
		p("Time per request, sequential on one keep-alive connection through the dispatch; %d rounds × %d requests per route and kind, interleaved in blocks of %d, after %d warm-up requests. "+
			"Each cell: the median of the requests' times, then each round's mean in brackets; the last column is the nginx workers' CPU time per request.",
			c.Rounds, c.Requests, c.Block, c.Warmup)
		p("Kinds: header = an x-session-id each; body = no header, a distinct chat body each (body key); none = a distinct body with no user message (no key, least load).")
		p("")
		p("| route | %s | nginx CPU per request: %s |", strings.Join(costKinds, " | "), strings.Join(costKinds, " / "))
		p("|---%s|---|", strings.Repeat("|---", len(costKinds)))
		for _, route := range c.Routes {
			var cells, cpu []string
			for _, k := range costKinds {
				for _, v := range c.Variants {
					if v.Route == route && v.Kind == k {
						cell := fmt.Sprintf("%.0f µs %s", v.P50, rounds(v.Rounds))
						if v.Failed > 0 {
							cell += fmt.Sprintf(" (%d failed)", v.Failed)
						}
						cells = append(cells, cell)
						cpu = append(cpu, fmt.Sprintf("%.0f", v.CPU))
					}
				}
			}
			p("| %s | %s | %s µs |", route, strings.Join(cells, " | "), strings.Join(cpu, " / "))
		}
		p("")
		small, big := c.Routes[1], c.Routes[len(c.Routes)-1]
		p("| ratio | median | rounds' means | nginx CPU |")
		p("|---|---|---|---|")
		p("| %s / plain | %s | %s | %s |", small, ratios(c.P50.EngineOverPlain), ratios(c.RoundMeans.EngineOverPlain), ratios(c.CPU.EngineOverPlain))
		p("| %s / %s | %s | %s | %s |", big, small, ratios(c.P50.BigOverSmall), ratios(c.RoundMeans.BigOverSmall), ratios(c.CPU.BigOverSmall))
	}
	if len(r.Goals) > 0 {
		p("")
		p("## goals")
		p("")
		p("| goal | measured | |")
		p("|---|---|---|")
		for _, gl := range r.Goals {
			p("| %s | %s | %s |", gl.Goal, gl.Measured, yesNo(gl.Met, "met", "**MISSED**"))
		}
	}
	for _, e := range r.Errors {
		p("")
		p("ERROR: %s", e)
	}
}

func limits(v overloadVariant) string {
	var parts []string
	for _, l := range v.Limits {
		if l == nil {
			parts = append(parts, "none")
		} else {
			parts = append(parts, fmt.Sprintf("%.0f", *l))
		}
	}
	s := strings.Join(parts, ", ")
	if s == "" {
		s = "-"
	}
	if v.LimitMin != nil {
		s += fmt.Sprintf(" (%.0f–%.0f)", *v.LimitMin, *v.LimitMax)
	}
	return s
}

func rounds(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.0f", x)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
