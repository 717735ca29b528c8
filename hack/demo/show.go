package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
)

// age formats a duration as kubectl does (5s, 3m12s, 2h).
func age(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 10*time.Minute:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

// table prints the routes like `kubectl get mr -A`, followed by the Ready
// condition's reason for routes that are not ready.
func (d *demo) table(ctx context.Context) error {
	rows, err := d.routes(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(d.out, "\n    $ kubectl get mr -A")
	tw := tabwriter.NewWriter(d.out, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "    NAMESPACE\tNAME\tBACKENDS\tCART\tCANARY\tREADY\tSYNCED\tAGE")
	for _, r := range rows {
		fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ns, r.name, r.backends, r.cart, r.canary, r.ready, r.synced, r.age)
	}
	tw.Flush()
	for _, r := range rows {
		if r.ready != "True" && r.reason != "" {
			fmt.Fprintf(d.out, "    %s: Ready=%s %s: %s\n", r.name, r.ready, r.reason, shorten(r.msg, 150))
		}
	}
	return nil
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// showChange prints the lines of an output that changed since it was last
// shown (keep selects the interesting lines), or the selected lines the
// first time.
func (d *demo) showChange(label, content string, keep func(string) bool) {
	prev, seen := d.last[label]
	d.last[label] = content
	now := pick(content, keep)
	if !seen {
		fmt.Fprintf(d.out, "    %s:\n", label)
		for _, l := range now {
			fmt.Fprintf(d.out, "        %s\n", l)
		}
		return
	}
	removed, added := lineDiff(pick(prev, keep), now)
	if len(removed)+len(added) == 0 {
		fmt.Fprintf(d.out, "    %s: unchanged\n", label)
		return
	}
	fmt.Fprintf(d.out, "    %s:\n", label)
	for _, l := range removed {
		fmt.Fprintf(d.out, "      - %s\n", l)
	}
	for _, l := range added {
		fmt.Fprintf(d.out, "      + %s\n", l)
	}
}

func pick(s string, keep func(string) bool) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if keep(l) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

// lineDiff returns the lines of a missing from b and of b missing from a,
// in order, counting duplicates (enough for lists of servers and workers).
func lineDiff(a, b []string) (removed, added []string) {
	count := map[string]int{}
	for _, l := range b {
		count[l]++
	}
	for _, l := range a {
		if count[l] > 0 {
			count[l]--
		} else {
			removed = append(removed, l)
		}
	}
	count = map[string]int{}
	for _, l := range a {
		count[l]++
	}
	for _, l := range b {
		if count[l] > 0 {
			count[l]--
		} else {
			added = append(added, l)
		}
	}
	return removed, added
}

// Line selectors of the interesting parts of each output.
func upstreamServer(l string) bool {
	return strings.HasPrefix(strings.TrimSpace(l), "server ") && strings.Contains(l, "max_fails")
}
func cartWorker(l string) bool { return strings.Contains(l, "- url:") }
func monitorLine(l string) bool {
	return strings.HasPrefix(l, "service:") || strings.HasPrefix(l, "nginx:") || strings.HasPrefix(l, "router:")
}
func backendPeer(l string) bool {
	return strings.Contains(l, `[ "host" ]`)
}
