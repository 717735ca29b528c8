package reload

import (
	"github.com/prometheus/client_golang/prometheus"
)

// MetricsPrefix prefixes every metric of the reload sidecar.
const MetricsPrefix = "autoconfig_reload_"

// Results of one reload attempt, the values of reloads_total{result}.
const (
	ResultSuccess     = "success"      // signalled, and the worker pids changed
	ResultFailed      = "failed"       // signalled, worker pids did not change: the target kept its old config
	ResultSignalled   = "signalled"    // signalled a target without children: not verifiable
	ResultCheckFailed = "check_failed" // --check-cmd failed: not signalled
	ResultNoProcess   = "no_process"   // nothing matched --process: not signalled
	ResultAmbiguous   = "ambiguous"    // several processes matched: not signalled
	ResultError       = "error"        // /proc unreadable, signal refused, …: not signalled
	// ResultContentChanged: the content changed between the check and the
	// signal: not signalled, the new content is checked.
	ResultContentChanged = "content_changed"
)

// Metrics of the sidecar, registered on a private registry.
type Metrics struct {
	Reloads            *prometheus.CounterVec
	LastSuccess        prometheus.Gauge
	LastAttempt        prometheus.Gauge
	Changes            prometheus.Counter
	StaleSockets       prometheus.Counter
	ReloadDuration     prometheus.Histogram
	ConfigMapWrites    *prometheus.CounterVec
	LastConfigMapWrite prometheus.Gauge
	QuarantinedKeys    prometheus.Gauge
	ReportErrors       prometheus.Counter
	Pushes             *prometheus.CounterVec
	PushDuration       prometheus.Histogram
	PeersUnserved      *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them on reg with
// MetricsPrefix.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reloads_total",
			Help: "Reload attempts by result: success, failed (workers unchanged), signalled (unverifiable target), check_failed, content_changed (between check and signal: not signalled), no_process, ambiguous, error.",
		}, []string{"result"}),
		LastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "last_reload_success_timestamp_seconds",
			Help: "Unix time of the last reload with result success or signalled.",
		}),
		LastAttempt: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "last_reload_attempt_timestamp_seconds",
			Help: "Unix time of the last reload attempt, whatever its result.",
		}),
		Changes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "config_changes_total",
			Help: "Settled changes of the watched directories' visible content.",
		}),
		StaleSockets: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stale_sockets_removed_total",
			Help: "Unix socket files removed because connect() was refused.",
		}),
		ReloadDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "reload_duration_seconds",
			Help:    "From the settled change to the verified (or failed) reload.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 12),
		}),
		ConfigMapWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "configmap_writes_total",
			Help: "API mode: writes of the ConfigMap's keys into --write-dir by result (written, unchanged, error).",
		}, []string{"result"}),
		LastConfigMapWrite: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "last_configmap_write_timestamp_seconds",
			Help: "API mode: Unix time of the last write into --write-dir.",
		}),
		QuarantinedKeys: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "quarantined_keys",
			Help: "API mode with --check-cmd: keys whose new version fails the check; their last good version stays on disk and the other keys are loaded.",
		}),
		ReportErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "served_report_errors_total",
			Help: "With --pod-name: failed writes of the served-content annotation on the sidecar's own Pod (each is retried).",
		}),
		Pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "peers_pushes_total",
			Help: "Dynamic peers: pushes of a peers table to the engine's control socket by result: accepted, refused (by the engine: full dict, older serial, its own check), invalid (refused by the sidecar before any push, once per content: fails the engine's rules or names another route than its key), no_route (the engine has no such route: the first for a content of the route files reloads once, later ones are the backoff's pushes of a table waiting for its route), error (no answer, unreadable file).",
		}, []string{"result"}),
		PushDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "peers_push_duration_seconds",
			Help:    "Dynamic peers: one table's push, from reading the file to the engine's acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14),
		}),
		PeersUnserved: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "peers_tables_unserved",
			Help: "Dynamic peers: peers tables on disk whose content the engine does not hold, by the reason of their last push: invalid (waits for a new content), no_route (waits for its route: pushed after every reload and with backoff), refused and error (pushed again at every resync).",
		}, []string{"reason"}),
	}
	for _, r := range []string{PushAccepted, PushRefused, PushInvalid, PushNoRoute, PushError} {
		m.Pushes.WithLabelValues(r)
	}
	for _, r := range []string{PushInvalid, PushNoRoute, PushRefused, PushError} {
		m.PeersUnserved.WithLabelValues(r)
	}
	for _, r := range []string{ResultSuccess, ResultFailed, ResultSignalled, ResultCheckFailed, ResultNoProcess, ResultAmbiguous, ResultError, ResultContentChanged} {
		m.Reloads.WithLabelValues(r)
	}
	prometheus.WrapRegistererWithPrefix(MetricsPrefix, reg).MustRegister(
		m.Reloads, m.LastSuccess, m.LastAttempt, m.Changes, m.StaleSockets, m.ReloadDuration, m.ConfigMapWrites, m.LastConfigMapWrite, m.QuarantinedKeys, m.ReportErrors, m.Pushes, m.PushDuration, m.PeersUnserved)
	return m
}
