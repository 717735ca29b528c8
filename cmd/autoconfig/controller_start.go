package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
)

// How a replica that cannot reach the API server waits for it: each
// attempt is one discovery request (what setting up the controller's
// indexes and watches needs first) with its own timeout, so a black-holed
// connection costs apiAttemptTimeout and not forever; the pause between
// attempts doubles from apiRetryMin up to apiRetryMax. The cap bounds how
// long a replica keeps sleeping after the API server is back (a
// CrashLoopBackOff, what exiting used to cost, grows to 5 minutes).
const (
	apiAttemptTimeout = 5 * time.Second
	apiRetryMin       = 500 * time.Millisecond
	apiRetryMax       = 10 * time.Second
)

// apiServerReachable is one attempt: the discovery requests setting up
// the controller makes first (GET /api and /apis), within
// apiAttemptTimeout, so a black-holed connection does not hang it; nil
// when the API server answers both.
func apiServerReachable(ctx context.Context, cfg *rest.Config) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("discovery client: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, apiAttemptTimeout)
	defer cancel()
	for _, p := range []string{"/api", "/apis"} {
		if err := dc.RESTClient().Get().AbsPath(p).Do(ctx).Error(); err != nil {
			return err
		}
	}
	return nil
}

// waitForAPIServer returns once the API server answers discovery,
// retrying with a bounded backoff and logging each failure with what it
// waits for; it returns ctx's error as soon as ctx ends.
func waitForAPIServer(ctx context.Context, cfg *rest.Config, log logr.Logger) error {
	start := time.Now()
	delay := apiRetryMin
	for attempt := 1; ; attempt++ {
		err := apiServerReachable(ctx, cfg)
		if err == nil {
			if attempt > 1 {
				log.Info("API server reachable", "host", cfg.Host, "attempts", attempt, "waited", time.Since(start).Round(time.Millisecond).String())
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		log.Info("API server not reachable; waiting for it before setting up the controller",
			"waitingFor", "API discovery (GET /api, /apis) at "+cfg.Host,
			"attempt", attempt, "retryIn", delay.String(), "error", err.Error())
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, apiRetryMax)
	}
}

// setupState is what /readyz reports until the controller is set up and
// its caches synced: the replica is alive (/healthz answers) while it
// waits for the API server, but not ready.
type setupState struct {
	state atomic.Pointer[string]
}

func newSetupState(s string) *setupState {
	st := &setupState{}
	st.set(s)
	return st
}

func (s *setupState) set(state string) { s.state.Store(&state) }

// check is the readyz check "setup": ready once the state is "".
func (s *setupState) check(*http.Request) error {
	if st := *s.state.Load(); st != "" {
		return errors.New(st)
	}
	return nil
}

// readyRunnable marks the replica ready: the manager starts it (leader or
// standby) once its caches have synced.
type readyRunnable struct{ s *setupState }

func (r readyRunnable) Start(ctx context.Context) error {
	r.s.set("")
	<-ctx.Done()
	return nil
}

func (readyRunnable) NeedLeaderElection() bool { return false }

// probeServer serves /healthz (the process is alive: always ok) and
// /readyz (set up and synced) from the start, before the manager exists,
// in controller-runtime's format (/readyz/<check>, ?verbose). The manager
// binds no listener of its own, so a failed setup can be retried with a
// new one.
func probeServer(addr string, ready *setupState) *http.Server {
	mux := http.NewServeMux()
	live := &healthz.Handler{Checks: map[string]healthz.Checker{"ping": healthz.Ping}}
	rdy := &healthz.Handler{Checks: map[string]healthz.Checker{"ping": healthz.Ping, "setup": ready.check}}
	mux.Handle("/healthz", http.StripPrefix("/healthz", live))
	mux.Handle("/healthz/", http.StripPrefix("/healthz", live))
	mux.Handle("/readyz", http.StripPrefix("/readyz", rdy))
	mux.Handle("/readyz/", http.StripPrefix("/readyz", rdy))
	return &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
}

// pprofServer serves Go's profiles, as controller-runtime's would.
func pprofServer(addr string) *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
}

// serve binds srv's address ("" or "0": nothing) and serves it until stop
// is called; a bind failure is returned at once.
func serve(srv *http.Server, name string, log logr.Logger) (stop func(), err error) {
	if srv.Addr == "" || srv.Addr == "0" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	log.Info("serving "+name, "addr", ln.Addr().String())
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, name+" stopped")
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// leaderElectionLost is the error controller-runtime's manager reports
// when the leader elector stops, which it also does on a clean shutdown
// (and for a standby that never led).
const leaderElectionLost = "leader election lost"

// shutdownSink is the manager's log sink: once the replica is shutting
// down (stopping reports true), the manager's "leader election lost" from
// stopping its leader elector is an info line, not an error, and so is a
// request the shutdown cut off (context canceled: an event being sent).
// Losing the lease while running still ends Start with that error (exit 1).
type shutdownSink struct {
	logr.LogSink
	stopping func() bool
}

func (s shutdownSink) Error(err error, msg string, kv ...any) {
	switch {
	case err != nil && err.Error() == leaderElectionLost && s.stopping():
		s.LogSink.Info(0, "left leader election on shutdown", kv...)
		return
	case errors.Is(err, context.Canceled) && s.stopping():
		// A request cut off by the shutdown (an event being sent, a
		// write in flight): not a failure.
		s.LogSink.Info(0, msg+" (cut off by shutdown)", append(kv, "err", err.Error())...)
		return
	}
	s.LogSink.Error(err, msg, kv...)
}

func (s shutdownSink) WithValues(kv ...any) logr.LogSink {
	return shutdownSink{s.LogSink.WithValues(kv...), s.stopping}
}

func (s shutdownSink) WithName(name string) logr.LogSink {
	return shutdownSink{s.LogSink.WithName(name), s.stopping}
}
