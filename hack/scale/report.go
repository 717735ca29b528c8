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
	fmt.Fprintf(w, "- cluster: %d pods on %d GPU nodes in %d namespaces; one Service per route, EndpointSlices of at most %d endpoints; %s routes (backend tier only) into shared ConfigMaps; rollout changes %d %% of the pod IPs\n\n",
		o.Pods, o.Nodes, o.Namespaces, o.SliceSize, o.ModelType, o.RolloutPercent)

	cols := []string{"routes × CMs", "setup s", "initial sync s", "sync CPU s", "RSS after sync MiB", "VmHWM MiB", "max sampled RSS MiB",
		"rollout convergence s", "rollout CPU s", "CM writes per CM in rollout (mean / max)", "watch MiB sync / rollout",
		"floor RSS MiB", "RSS / floor", "controller API requests sync / rollout", "run wall s"}
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	for _, r := range results {
		if r.Error != "" {
			fmt.Fprintf(w, "| %s | FAILED: %s |%s\n", r.Shape, oneLine(r.Error), strings.Repeat(" |", len(cols)-2))
			continue
		}
		floorRSS, ratio := "-", "-"
		if r.Floor != nil {
			floorRSS, ratio = f1(kibToMiB(r.Floor.RSSKiB)), fmt.Sprintf("%.1f×", r.RatioAfterSync)
		}
		api := "-"
		if r.Sync.API != nil && r.Rollout.API != nil {
			api = fmt.Sprintf("%.0f / %.0f", r.Sync.API.Requests, r.Rollout.API.Requests)
		}
		row := []string{
			r.Shape.String(),
			f1(r.Setup.Total),
			f1(r.Sync.Seconds),
			f1(r.Sync.CPUSeconds),
			f1(kibToMiB(r.Memory.RSSAfterSyncKiB)),
			f1(kibToMiB(r.Memory.HWMKiB)),
			f1(kibToMiB(r.Memory.MaxSampledKiB)),
			fmt.Sprintf("%.2f", r.Rollout.Seconds),
			f1(r.Rollout.CPUSeconds),
			fmt.Sprintf("%.1f / %d", r.Rollout.WritesPerCM.Mean, r.Rollout.WritesPerCM.Max),
			fmt.Sprintf("%.1f / %.1f", float64(r.Sync.Watch.Bytes)/(1<<20), float64(r.Rollout.Watch.Bytes)/(1<<20)),
			floorRSS,
			ratio,
			api,
			f1(r.WallSeconds),
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
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
