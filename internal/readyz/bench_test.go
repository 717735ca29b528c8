package readyz

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/readiness"
)

// BenchmarkReadyz1000Callers hammers GET /readyz over real HTTP from 1000
// concurrent callers against this machine's /proc with the default 1 s
// TTL, and reports how many scans that cost. Run it with -benchtime=5s:
//
//	go test -run '^$' -bench Readyz1000 -benchtime=5s ./internal/readyz/
//
// scans/ttl is scans per TTL window of wall time (the goal is <= 1; the
// first window also pays the initial scan). "missing" requires a port
// nobody listens on, so every scan reads every row, including the ~2000
// rows of the benchmark's own connections.
func BenchmarkReadyz1000Callers(b *testing.B) {
	const callers = 1000
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	present := ln.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		name string
		port int
		code int
	}{{"present", present, 200}, {"missing", 1, 503}} {
		b.Run(tc.name, func(b *testing.B) {
			d, err := readiness.NewDetector(readiness.Options{Ports: []int{tc.port}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			reg, m := newRegistry(d)
			srv := httptest.NewServer(newMux(d, reg, m))
			defer srv.Close()
			tr := &http.Transport{MaxIdleConnsPerHost: callers, MaxIdleConns: callers}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
			url := srv.URL + "/readyz"

			b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			start, scans0 := time.Now(), d.Scans()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := client.Get(url)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != tc.code {
						b.Errorf("status %d, want %d", resp.StatusCode, tc.code)
						return
					}
				}
			})
			elapsed, scans := time.Since(start), d.Scans()-scans0
			b.ReportMetric(float64(scans), "scans")
			b.ReportMetric(float64(scans)/(elapsed.Seconds()/readiness.DefaultTTL.Seconds()), "scans/ttl")
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
		})
	}
}
