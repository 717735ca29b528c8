package testbin

import (
	"slices"
	"time"
)

// PercentileMs is the q-quantile (0..1, nearest rank) of d in
// milliseconds, for benchmarks' b.ReportMetric; 0 for no samples.
func PercentileMs(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(q*float64(len(s))))].Microseconds()) / 1000
}
