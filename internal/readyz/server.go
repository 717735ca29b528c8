// The HTTP side of readyz: /readyz, /health, /healthz and /metrics, and
// Run, which serves them until the context ends.

package readyz

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/modelsphere/autoconfig/internal/readiness"
)

type readyBody struct {
	Status           string `json:"status"`
	MissingListeners []int  `json:"missingListeners,omitempty"`
	Error            string `json:"error,omitempty"`
}

// newMux serves /readyz, /health, /healthz and /metrics. Method patterns
// make anything but GET and HEAD a 405 with an Allow header.
func newMux(d *readiness.Detector, reg *prometheus.Registry, m *metrics) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		res := d.Check(r.Context())
		code, body := http.StatusOK, readyBody{Status: "ready"}
		switch {
		case res.Err != nil:
			// The caller went away while waiting for a scan.
			code, body = http.StatusServiceUnavailable, readyBody{Status: "not ready", Error: res.Err.Error()}
		case !res.Ready:
			code, body = http.StatusServiceUnavailable, readyBody{Status: "not ready", MissingListeners: res.Missing}
		}
		if res.Err == nil {
			m.ready.Set(b2f(res.Ready))
			m.enforced.Set(b2f(res.Enforced))
			m.missing.Set(float64(len(res.Missing)))
		}
		m.requests.WithLabelValues(strconv.Itoa(code)).Inc()
		writeJSON(w, code, body)
	})
	health := func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}
	mux.HandleFunc("GET /health", health)
	mux.HandleFunc("GET /healthz", health)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Run listens on o.Listen and serves until ctx ends.
func Run(ctx context.Context, o *Options, logger *slog.Logger) error {
	d, err := readiness.NewDetector(readiness.Options{ProcRoot: o.ProcRoot, Ports: o.Ports, TTL: o.CacheTTL, Logger: logger})
	if err != nil {
		return fmt.Errorf("readiness detector: %w", err)
	}
	reg, m := newRegistry(d)
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{
		Handler:           newMux(d, reg, m),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	logger.Info("listening", "addr", ln.Addr().String(), "requiredListeners", o.Ports, "procRoot", o.ProcRoot, "cacheTTL", o.CacheTTL.String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
