package reload

// This file: the served report. After the target loaded a content, the
// sidecar records on its own Pod which content of each key that is
// (package served has the format and why the Pod is the channel).

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/modelsphere/autoconfig/internal/served"
)

// PodReporter keeps the served annotation of one Pod (the sidecar's own)
// up to date. Report never blocks the reload loop: the newest report
// replaces one not yet written, and a failed write is retried with backoff
// (up to RetryMax) until it lands or a newer report replaces it.
type PodReporter struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string
	RetryMax  time.Duration
	Log       *slog.Logger
	Metrics   *Metrics

	once     sync.Once
	mu       sync.Mutex
	pending  *served.Report
	last     *served.Report           // the last report given, without demand
	demand   map[string]served.Demand // the engine's demand (demand.go)
	demandAt time.Time                // when the engine's demand was read
	wake     chan struct{}
}

func (p *PodReporter) init() {
	p.once.Do(func() {
		p.wake = make(chan struct{}, 1)
		if p.RetryMax <= 0 {
			p.RetryMax = DefaultRetryMax
		}
		if p.Log == nil {
			p.Log = slog.New(slog.DiscardHandler)
		}
	})
}

// Report queues r as the Pod's served report (with the demand last set).
func (p *PodReporter) Report(r served.Report) {
	p.init()
	p.mu.Lock()
	p.last = &r
	p.queue()
	p.mu.Unlock()
}

// SetDemand queues the last report again with demand d, read from the
// engine at time at (demand.go: on a change, and as the heartbeat); before
// the first report it is kept for it.
func (p *PodReporter) SetDemand(d map[string]served.Demand, at time.Time) {
	p.init()
	p.mu.Lock()
	p.demand, p.demandAt = d, at
	if p.last != nil {
		p.queue()
	}
	p.mu.Unlock()
}

// queue makes the last report with the demand the pending one and wakes
// Run; p.mu is held.
func (p *PodReporter) queue() {
	r := *p.last
	if len(p.demand) > 0 {
		// DemandAt only with a demand: a pod without scale-to-zero
		// routes keeps its report as it was.
		r.Demand, r.DemandAt = p.demand, p.demandAt.UTC().Truncate(time.Second)
	}
	p.pending = &r
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Run writes the queued reports until ctx is done.
func (p *PodReporter) Run(ctx context.Context) error {
	p.init()
	var backoff time.Duration
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.wake:
		case <-retry:
		}
		retry = nil
		p.mu.Lock()
		r := p.pending
		p.pending = nil
		p.mu.Unlock()
		if r == nil {
			continue
		}
		if err := p.write(ctx, *r); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			backoff = min(max(2*backoff, retryMin), p.RetryMax)
			p.Log.Error("cannot record the served content on the pod; retrying", "pod", p.Namespace+"/"+p.Name, "in", backoff, "err", err)
			if p.Metrics != nil {
				p.Metrics.ReportErrors.Inc()
			}
			p.mu.Lock()
			if p.pending == nil { // a newer report goes first
				p.pending = r
			}
			p.mu.Unlock()
			retry = time.After(backoff)
			continue
		}
		backoff = 0
		p.Log.Debug("recorded the served content on the pod", "pod", p.Namespace+"/"+p.Name, "how", r.How, "keys", len(r.Keys))
	}
}

// write merge-patches the annotation (nothing else of the Pod).
func (p *PodReporter) write(ctx context.Context, r served.Report) error {
	v, err := r.Marshal()
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{served.Annotation: v}}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = p.Client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// servedReport is the report of snap, loaded by the target as how says.
func servedReport(snap Snapshot, how string, at time.Time) served.Report {
	keys := make(map[string]string, len(snap.Keys))
	for k, sum := range snap.Keys {
		keys[k] = sum[:served.IDLen]
	}
	return served.Report{At: at.UTC().Truncate(time.Second), How: how, Keys: keys}
}
