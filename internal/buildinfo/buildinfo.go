// Package buildinfo exposes the binaries' version as the metric
// autoconfig_build_info, the convention of Prometheus' own *_build_info:
// a gauge of 1 whose labels carry the version, so dashboards can join on
// it and alerts can tell which build runs.
package buildinfo

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/modelsphere/autoconfig/internal/cli"
)

// Name is the metric's name.
const Name = "autoconfig_build_info"

// Collector is autoconfig_build_info{binary, version, commit, build_date}
// = 1 (commit and build_date "unknown" in an unstamped build).
func Collector(binary string) prometheus.Collector {
	commit, date := cli.Commit, cli.BuildDate
	if commit == "" {
		commit = "unknown"
	}
	if date == "" {
		date = "unknown"
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        Name,
		Help:        "Always 1; the labels say which build of which binary runs (commit and build_date are unknown in an unstamped build).",
		ConstLabels: prometheus.Labels{"binary": binary, "version": cli.Version, "commit": commit, "build_date": date},
	})
	g.Set(1)
	return g
}
