package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
)

// writeReport prints the markdown table (one row per run) and the raw
// numbers (one JSON object per run).
func writeReport(w io.Writer, b *bench, results []*result) {
	o := b.o
	fmt.Fprintf(w, "# autoconfig scale benchmark\n\n")
	fmt.Fprintf(w, "- date: %s; %d CPUs; %s\n", b.build.Date, runtime.NumCPU(), b.build.GoVersion)
	fmt.Fprintf(w, "- command: `%s`\n", b.build.Command)
	fmt.Fprintf(w, "- controller: %s at commit %s%s\n", b.build.Binary, short(b.build.Commit), dirtyNote(b.build.DirtyFiles))
	fmt.Fprintf(w, "- cluster: %d pods on %d GPU nodes in %d namespaces; one Service per route, EndpointSlices of at most %d endpoints; %s routes (backend tier only) into shared ConfigMaps; rollout changes %d %% of the pod IPs\n",
		o.Pods, o.Nodes, o.Namespaces, o.SliceSize, o.ModelType, o.RolloutPercent)
	if o.SelectorShare > 0 {
		fmt.Fprintf(w, "- %.0f %% of the routes discover their pods by selector (no Service, no EndpointSlices); the floor is measured again with the pods of their namespaces\n", 100*o.SelectorShare)
	}
	if o.Takeover {
		fmt.Fprintf(w, "- takeover: two replicas (%s); after the sync the leader gets SIGKILL and one pod of %d routes moves; no rollout\n", strings.Join(takeoverArgs, " "), o.TakeoverRoutes)
	}
	fmt.Fprintln(w)

	cols := []string{"routes × CMs", "setup s", "initial sync s", "sync CPU s", "RSS after sync MiB", "VmHWM MiB", "max sampled RSS MiB",
		"rollout convergence s", "rollout CPU s", "CM writes per CM in rollout (mean / max)", "watch MiB sync / rollout",
		"floor RSS MiB", "RSS / floor", "controller API requests sync / rollout", "run wall s"}
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	for _, r := range results {
		if r.Error != "" {
			fmt.Fprintf(w, "| %s | FAILED: %s |%s\n", runLabel(r), oneLine(r.Error), strings.Repeat(" |", len(cols)-2))
			continue
		}
		floorRSS, ratio := "-", "-"
		if r.Floor != nil {
			floorRSS, ratio = f1(kibToMiB(r.Floor.RSSKiB)), fmt.Sprintf("%.1f×", r.RatioAfterSync)
		}
		api, watch := "-", fmt.Sprintf("%.1f / %.1f", float64(r.Sync.Watch.Bytes)/(1<<20), float64(r.Rollout.Watch.Bytes)/(1<<20))
		if r.Sync.API != nil && r.Rollout.API != nil {
			api = fmt.Sprintf("%.0f / %.0f", r.Sync.API.Requests, r.Rollout.API.Requests)
		}
		rollout := []string{fmt.Sprintf("%.2f", r.Rollout.Seconds), f1(r.Rollout.CPUSeconds), fmt.Sprintf("%.1f / %d", r.Rollout.WritesPerCM.Mean, r.Rollout.WritesPerCM.Max)}
		if r.Mode == "takeover" {
			rollout = []string{"-", "-", "-"}
			watch = fmt.Sprintf("%.1f / -", float64(r.Sync.Watch.Bytes)/(1<<20))
			if r.Sync.API != nil {
				api = fmt.Sprintf("%.0f / -", r.Sync.API.Requests)
			}
		}
		row := []string{
			runLabel(r),
			f1(r.Setup.Total),
			f1(r.Sync.Seconds),
			f1(r.Sync.CPUSeconds),
			f1(kibToMiB(r.Memory.RSSAfterSyncKiB)),
			f1(kibToMiB(r.Memory.HWMKiB)),
			f1(kibToMiB(r.Memory.MaxSampledKiB)),
			rollout[0], rollout[1], rollout[2],
			watch,
			floorRSS,
			ratio,
			api,
			f1(r.WallSeconds),
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	writeColdStart(w, results)
	writeTakeover(w, results)
	fmt.Fprintf(w, "\nraw numbers, one JSON object per run:\n\n")
	for _, r := range results {
		b, _ := json.Marshal(r)
		fmt.Fprintf(w, "%s\n", b)
	}
	bi, _ := json.Marshal(b.build)
	fmt.Fprintf(w, "build: %s\n", bi)
}

func kibToMiB(k int64) float64 { return float64(k) / 1024 }

func f1(v float64) string { return fmt.Sprintf("%.1f", v) }

func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return strings.ReplaceAll(s, "|", "/")
}

// runLabel is a run's first column: the shape, and how many routes discover
// by selector.
func runLabel(r *result) string {
	if r.SelectorRoutes > 0 {
		return fmt.Sprintf("%s (%d by selector)", r.Shape, r.SelectorRoutes)
	}
	return r.Shape.String()
}

func table(w io.Writer, title string, cols []string) {
	fmt.Fprintf(w, "\n%s\n\n| %s |\n|%s\n", title, strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
}

// writeColdStart prints the cold start of every run that got through it.
func writeColdStart(w io.Writer, results []*result) {
	table(w, "Cold start (controller start → every key current and every route Ready):", []string{"routes × CMs", "cold start s", "CMs current s", "routes Ready s",
		"ModelRoute writes (status / other; max per route)", "CM writes total / max per CM", "CM watch MiB", "RSS after sync MiB", "VmHWM MiB",
		"floor RSS MiB (slices / + pods)", "RSS / floor (slices / + pods)"})
	for _, r := range results {
		if r.Cold.Seconds == 0 || r.Sync.Routes == nil {
			continue
		}
		floor, ratio := "-", "-"
		if r.Floor != nil {
			floor, ratio = f1(kibToMiB(r.Floor.RSSKiB)), fmt.Sprintf("%.1f×", r.RatioAfterSync)
		}
		if r.FloorPods != nil {
			floor += " / " + f1(kibToMiB(r.FloorPods.RSSKiB))
			ratio += fmt.Sprintf(" / %.1f×", r.RatioAfterSyncPods)
		}
		rw := r.Sync.Routes
		row := []string{runLabel(r), fmt.Sprintf("%.2f", r.Cold.Seconds), fmt.Sprintf("%.2f", r.Cold.ConfigMapsSeconds), fmt.Sprintf("%.2f", r.Cold.RoutesReadySeconds),
			fmt.Sprintf("%d (%d / %d; %d)", rw.Total, rw.Status, rw.Other, rw.MaxPerRoute),
			fmt.Sprintf("%d / %d", r.Sync.WritesPerCM.Total, r.Sync.WritesPerCM.Max),
			fmt.Sprintf("%.1f", float64(r.Sync.Watch.Bytes)/(1<<20)),
			f1(kibToMiB(r.Memory.RSSAfterSyncKiB)), f1(kibToMiB(r.Memory.HWMKiB)), floor, ratio}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
}

// writeTakeover prints the takeover of every -takeover run that got
// through it.
func writeTakeover(w io.Writer, results []*result) {
	var rows []*result
	for _, r := range results {
		if r.Takeover != nil && r.Takeover.Routes != nil {
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return
	}
	table(w, "Takeover (SIGKILL to the leader, then one pod of some routes moves):", []string{"routes × CMs", "lease duration s", "kill → Lease acquired s", "acquired → converged s", "kill → converged s",
		"routes changed", "CM writes: changed routes' CMs / others", "ModelRoute writes: changed routes / others (status of others)", "new leader CPU s",
		"standby RSS before / new leader RSS after MiB", "controller API requests"})
	for _, r := range rows {
		t := r.Takeover
		api := "-"
		if t.API != nil {
			api = fmt.Sprintf("%.0f", t.API.Requests)
		}
		row := []string{runLabel(r), fmt.Sprint(t.LeaseDurationSeconds), fmt.Sprintf("%.2f", t.AcquireSeconds), fmt.Sprintf("%.2f", t.ConvergeSeconds), fmt.Sprintf("%.2f", t.TotalSeconds),
			fmt.Sprint(t.ChangedRoutes),
			fmt.Sprintf("%d / %d", t.CMWritesChanged, t.CMWritesUnchanged),
			fmt.Sprintf("%d / %d (%d)", t.Routes.Total-t.Routes.UnchangedTotal, t.Routes.UnchangedTotal, t.Routes.UnchangedStatus),
			f1(t.CPUSeconds),
			fmt.Sprintf("%.1f / %.1f", kibToMiB(t.StandbyRSSKiB), kibToMiB(t.NewLeaderRSSKiB)),
			api}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
}
