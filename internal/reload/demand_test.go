package reload

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/served"
)

var d0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// nextDemand: the waiting count as it is; the last request only in steps
// of the granularity (so a busy route rewrites the report once a step);
// a route that comes or goes changes the report.
func TestNextDemand(t *testing.T) {
	step := 10 * time.Second
	type m = map[string]served.Demand
	for _, c := range []struct {
		name      string
		prev, now m
		want      m
		changed   bool
	}{
		{"nothing", nil, m{}, m{}, false},
		{"a route appears, no request yet", nil, m{"q": {}}, m{"q": {}}, true},
		{"first request", m{"q": {}}, m{"q": {Last: d0.Add(1500 * time.Millisecond)}}, m{"q": {Last: d0.Add(time.Second)}}, true},
		{"a later request within the step: unchanged", m{"q": {Last: d0}}, m{"q": {Last: d0.Add(9 * time.Second)}}, m{"q": {Last: d0}}, false},
		{"a request a step later", m{"q": {Last: d0}}, m{"q": {Last: d0.Add(10 * time.Second)}}, m{"q": {Last: d0.Add(10 * time.Second)}}, true},
		{"requests held", m{"q": {Last: d0}}, m{"q": {Waiting: 2, Last: d0.Add(time.Second)}}, m{"q": {Waiting: 2, Last: d0}}, true},
		{"held requests served", m{"q": {Waiting: 2, Last: d0}}, m{"q": {Last: d0.Add(time.Second)}}, m{"q": {Last: d0}}, true},
		{"a route goes", m{"q": {Last: d0}, "r": {}}, m{"q": {Last: d0}}, m{"q": {Last: d0}}, true},
		// The open count: 0 to more and back to 0 at once, other changes
		// only with a change of Last.
		{"a request opens: at once", m{"q": {Last: d0}}, m{"q": {Open: 1, Last: d0.Add(2 * time.Second)}}, m{"q": {Open: 1, Last: d0}}, true},
		{"a second request opens: not alone", m{"q": {Open: 1, Last: d0}}, m{"q": {Open: 2, Last: d0.Add(3 * time.Second)}}, m{"q": {Open: 1, Last: d0}}, false},
		{"one of two ends: not alone", m{"q": {Open: 2, Last: d0}}, m{"q": {Open: 1, Last: d0.Add(3 * time.Second)}}, m{"q": {Open: 2, Last: d0}}, false},
		{"the count rides along with Last", m{"q": {Open: 1, Last: d0}}, m{"q": {Open: 3, Last: d0.Add(10 * time.Second)}}, m{"q": {Open: 3, Last: d0.Add(10 * time.Second)}}, true},
		{"the last request ends: at once, with its end", m{"q": {Open: 1, Last: d0}}, m{"q": {Last: d0.Add(4700 * time.Millisecond)}}, m{"q": {Last: d0.Add(4 * time.Second)}}, true},
		{"all requests end after a step: the end", m{"q": {Open: 2, Last: d0}}, m{"q": {Last: d0.Add(95 * time.Second)}}, m{"q": {Last: d0.Add(95 * time.Second)}}, true},
		{"a new route with a request open", nil, m{"q": {Open: 1, Last: d0}}, m{"q": {Open: 1, Last: d0}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Every reported entry carries the step.
			withStep := func(in m) m {
				if in == nil {
					return nil
				}
				out := m{}
				for k, v := range in {
					v.StepSeconds = step.Seconds()
					out[k] = v
				}
				return out
			}
			c.prev, c.want = withStep(c.prev), withStep(c.want)
			got, changed := nextDemand(c.prev, c.now, step)
			if changed != c.changed || len(got) != len(c.want) {
				t.Fatalf("got %v changed %v, want %v changed %v", got, changed, c.want, c.changed)
			}
			for k, v := range c.want {
				if got[k] != v {
					t.Errorf("%s: got %+v, want %+v", k, got[k], v)
				}
			}
		})
	}
}

// The poller reads GET /demand on a unix socket and hands each change to
// Set; an engine that answers 404 (no scale to zero) or is down changes
// nothing. The report keeps the last served content with the demand.
func TestDemandPollerIntoReport(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "control.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	answer, code := `{"routes":{"qwen":{"waiting":3,"open":3,"last_request":1796299200.75,"last_end":1796299100.5,"held_total":3}}}`, 200
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path != "/demand" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(code)
		w.Write([]byte(answer))
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	rep := &PodReporter{}
	rep.Report(served.Report{How: served.HowReload, Keys: map[string]string{"a.conf": "0123"}})
	got := make(chan map[string]served.Demand, 16)
	p := &DemandPoller{Path: sock, Interval: 20 * time.Millisecond, Granularity: 10 * time.Second, Log: slog.New(slog.DiscardHandler),
		Set: func(d map[string]served.Demand, at time.Time) { rep.SetDemand(d, at); got <- d }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)
	first := <-got
	if want := (served.Demand{Waiting: 3, Open: 3, Last: time.Unix(1796299200, 0).UTC(), StepSeconds: 10}); first["qwen"] != want {
		t.Fatalf("demand %+v, want %+v", first["qwen"], want)
	}
	rep.mu.Lock()
	pending := *rep.pending
	rep.mu.Unlock()
	if pending.Keys["a.conf"] != "0123" || pending.Demand["qwen"].Waiting != 3 || pending.DemandAt.IsZero() {
		t.Fatalf("the queued report %+v lost the content, the demand or its time", pending)
	}
	// A later served report keeps the demand.
	rep.Report(served.Report{How: served.HowPush, Keys: map[string]string{"a.conf": "4567"}})
	rep.mu.Lock()
	pending = *rep.pending
	rep.mu.Unlock()
	if pending.Keys["a.conf"] != "4567" || pending.Demand["qwen"].Waiting != 3 {
		t.Fatalf("a new report %+v dropped the demand", pending)
	}

	// 404 (an engine without /demand), then served: only the change.
	mu.Lock()
	code, answer = 404, "no"
	mu.Unlock()
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	code, answer = 200, `{"routes":{"qwen":{"waiting":0,"open":2,"last_request":1796299201.0,"last_end":1796299202.5}}}`
	mu.Unlock()
	select {
	case d := <-got:
		if d["qwen"].Waiting != 0 || d["qwen"].Open != 3 || !d["qwen"].Last.Equal(time.Unix(1796299200, 0)) {
			t.Errorf("after the hold: %+v (the last request within the step keeps its reported time, the open count with it)", d["qwen"])
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the end of the hold never reached the report")
	}
	select {
	case d := <-got:
		t.Fatalf("a change with nothing changed: %+v", d)
	case <-time.After(200 * time.Millisecond):
	}
}

// The heartbeat: while a route's demand is reported, the poller hands the
// unchanged demand to Set again once DemandHeartbeatSteps steps passed
// since the last Set (a change or a heartbeat), and not before; with no
// demand at all there is none.
func TestDemandHeartbeat(t *testing.T) {
	step := time.Second
	p := &DemandPoller{Granularity: step}
	beat := served.DemandHeartbeatSteps * step
	q := map[string]served.Demand{"q": {Last: d0}}
	if _, ok := p.observe(q, d0); !ok {
		t.Fatal("the first demand was not set")
	}
	if _, ok := p.observe(q, d0.Add(beat-time.Millisecond)); ok {
		t.Fatal("a heartbeat before DemandHeartbeatSteps steps")
	}
	got, ok := p.observe(q, d0.Add(beat))
	if !ok || got["q"].Last != d0 {
		t.Fatalf("no heartbeat after DemandHeartbeatSteps steps: %v %v", got, ok)
	}
	// The next one counts from this one, and a change resets it.
	if _, ok := p.observe(q, d0.Add(2*beat-time.Millisecond)); ok {
		t.Fatal("a second heartbeat too early")
	}
	open := map[string]served.Demand{"q": {Open: 1, Last: d0}}
	if _, ok := p.observe(open, d0.Add(2*beat-time.Millisecond)); !ok {
		t.Fatal("a request opening was not set at once")
	}
	if _, ok := p.observe(open, d0.Add(3*beat-2*time.Millisecond)); ok {
		t.Fatal("a heartbeat within DemandHeartbeatSteps steps of a change")
	}
	if _, ok := p.observe(open, d0.Add(3*beat)); !ok {
		t.Fatal("no heartbeat after a change")
	}

	// No demand: no heartbeat.
	none := &DemandPoller{Granularity: step}
	if _, ok := none.observe(map[string]served.Demand{}, d0); ok {
		t.Fatal("an empty demand was set")
	}
	if _, ok := none.observe(map[string]served.Demand{}, d0.Add(10*beat)); ok {
		t.Fatal("a heartbeat with no demand")
	}
}

// The reporter writes the time the demand was read with the demand, and
// none without a demand (a pod without scale-to-zero routes keeps its
// report as it was).
func TestPodReporterDemandAt(t *testing.T) {
	rep := &PodReporter{}
	rep.Report(served.Report{How: served.HowReload, Keys: map[string]string{"a.conf": "0123"}})
	rep.SetDemand(nil, d0)
	if r := *rep.pending; !r.DemandAt.IsZero() || r.Demand != nil {
		t.Fatalf("a report without demand: %+v", r)
	}
	rep.SetDemand(map[string]served.Demand{"q": {Open: 1}}, d0.Add(1500*time.Millisecond))
	if r := *rep.pending; !r.DemandAt.Equal(d0.Add(time.Second)) || r.Demand["q"].Open != 1 {
		t.Fatalf("the demand's report: %+v", r)
	}
	rep.SetDemand(map[string]served.Demand{"q": {Open: 1}}, d0.Add(61*time.Second))
	if r := *rep.pending; !r.DemandAt.Equal(d0.Add(61 * time.Second)) {
		t.Fatalf("a heartbeat's report: %+v", r)
	}
	rep.Report(served.Report{How: served.HowPush, Keys: map[string]string{"a.conf": "4567"}})
	if r := *rep.pending; !r.DemandAt.Equal(d0.Add(61 * time.Second)) {
		t.Fatalf("a new served report dropped DemandAt: %+v", r)
	}
}
