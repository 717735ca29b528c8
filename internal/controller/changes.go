package controller

// This file: telling operators what changed. Every output write — the
// actual routing change — gets one info-level log line naming the
// ConfigMap, the keys and the backends added and removed since the
// route's previous write; and an event on the route, at most one per
// route per OutputChangeEventInterval and a few per second for all routes
// together (the rest are counted in the route's next event).

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/routemetrics"
	"github.com/modelsphere/autoconfig/internal/sink"
)

// OutputChangeEventInterval bounds the OutputChanged events of one route:
// a rollout rewrites a route's file every few seconds, and an event per
// write would flood `kubectl describe` and the API server; the log line
// is written for every change.
const OutputChangeEventInterval = 30 * time.Second

// ReasonOutputChanged is the reason of the event of an output write.
const ReasonOutputChanged = "OutputChanged"

// outputEventRate and outputEventBurst bound the OutputChanged events of
// all routes together: at 1000 routes a rollout changes every route within
// seconds, and an event each (1000 API writes, through the same client rate
// limit as the ConfigMap writes) slowed the rollout and grew the
// controller's memory by 20 MiB in the scale benchmark. The log line of
// each write stays.
const (
	outputEventRate  = 1 // per second
	outputEventBurst = 20
)

// changeLog remembers per route the backends of its last write and when
// it last emitted an OutputChanged event.
type changeLog struct {
	mu      sync.Mutex
	m       map[types.NamespacedName]*routeChanges
	limiter *rate.Limiter // all routes' events
}

type routeChanges struct {
	backends   []string
	known      bool
	lastEvent  time.Time
	suppressed int
}

// endpointSet is the sorted "ip:port" of eps.
func endpointSet(eps []compiler.Endpoint) []string {
	out := make([]string, 0, len(eps))
	for _, e := range eps {
		out = append(out, e.IP+":"+strconv.Itoa(int(e.Port)))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// diff returns what is in b and not in a (added) and the reverse.
func diff(a, b []string) (added, removed []string) {
	for _, x := range b {
		if _, ok := slices.BinarySearch(a, x); !ok {
			added = append(added, x)
		}
	}
	for _, x := range a {
		if _, ok := slices.BinarySearch(b, x); !ok {
			removed = append(removed, x)
		}
	}
	return added, removed
}

// record notes a write of route with backends and says what changed and
// whether an event is due (with how many were suppressed before it).
func (c *changeLog) record(key types.NamespacedName, backends []string, now time.Time) (added, removed []string, first, event bool, suppressed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[types.NamespacedName]*routeChanges{}
	}
	rc := c.m[key]
	if rc == nil {
		rc = &routeChanges{}
		c.m[key] = rc
	}
	first = !rc.known
	if !first {
		added, removed = diff(rc.backends, backends)
	}
	rc.backends, rc.known = backends, true
	if c.limiter == nil {
		c.limiter = rate.NewLimiter(outputEventRate, outputEventBurst)
	}
	if now.Sub(rc.lastEvent) >= OutputChangeEventInterval && c.limiter.AllowN(now, 1) {
		event, suppressed = true, rc.suppressed
		rc.lastEvent, rc.suppressed = now, 0
	} else {
		rc.suppressed++
	}
	return added, removed, first, event, suppressed
}

func (c *changeLog) forget(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}

// reportChanges logs every written output of this reconcile and emits the
// route's OutputChanged event when one is due.
func (r *Reconciler) reportChanges(st *state, outcomes []sink.Outcome) {
	var written []string
	for _, o := range outcomes {
		if o.State == sink.Written {
			written = append(written, o.ConfigMap+" "+strings.Join(o.Keys, ","))
		}
	}
	if len(written) == 0 {
		return
	}
	route := st.route
	key := types.NamespacedName{Namespace: route.Namespace, Name: route.Name}
	now := time.Now()
	changeToWrite.Observe(now.Sub(st.started).Seconds())
	routeSeries.Set(key, routemetrics.LastWrite, float64(now.Unix()))
	backends := endpointSet(st.snap.Backends)
	added, removed, first, event, suppressed := r.Routes.changes.record(key, backends, now)
	what := "first write since the controller started"
	if !first {
		what = fmt.Sprintf("backends added [%s], removed [%s]", strings.Join(added, " "), strings.Join(removed, " "))
		if len(added) == 0 && len(removed) == 0 {
			what = "backends unchanged (the spec, a tier or a ConfigMap's other content changed)"
		}
	}
	ctrl.Log.WithName(Name).Info("output changed", "route", key.String(), "outputs", written, "backends", len(backends), "added", added, "removed", removed, "change", what)
	if !event || r.Recorder == nil {
		return
	}
	msg := fmt.Sprintf("wrote %s: %d backends; %s", strings.Join(written, "; "), len(backends), what)
	if suppressed > 0 {
		msg += fmt.Sprintf(" (%d earlier writes in the last %s not reported as events; the controller log has each)", suppressed, OutputChangeEventInterval)
	}
	r.Recorder.Eventf(route, nil, corev1.EventTypeNormal, ReasonOutputChanged, "Write", "%s", truncate(msg))
}
