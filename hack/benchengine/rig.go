package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/endpoints"
	"github.com/modelsphere/autoconfig/internal/llmsim"
	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// backendTier is the one peer tier of every benchmark route: the
// discovered backends, no max_concurrency (so the adaptive limit ranges
// up to the engine's adaptive_cc_max).
var backendTier = routespec.Peer{Use: "backend", Priority: 2}

// rig is one real nginx running the shipped deploy/openresty/nginx.conf
// and router.lua (internal/nginxtest, Options.Reference).
type rig struct {
	n *nginxtest.Nginx
}

func startRig(workers int) (*rig, error) {
	n, err := nginxtest.Launch(nginxtest.Options{Reference: true, Workers: workers})
	if err != nil {
		return nil, fmt.Errorf("start nginx: %w", err)
	}
	return &rig{n: n}, nil
}

func (g *rig) close() {
	if err := g.n.Close(); err != nil {
		logf("nginx: %v", err)
	}
}

// llmRoute builds a defaulted llm route as the schema would return it
// (the shape of compiler/helpers_test.go's llmRoute).
func llmRoute(name string, values map[string]string, slo *routespec.SLO) *compiler.Route {
	r := &compiler.Route{Name: name, Namespace: "bench"}
	r.Spec = routespec.Spec{
		ModelType: routespec.ModelTypeLLM,
		Discovery: routespec.Discovery{Service: "llm/" + name},
		Nginx: routespec.Nginx{
			Route:           name,
			Peers:           []routespec.Peer{backendTier},
			OutputConfigMap: "openresty-conf",
			Values:          values,
		},
		SLO: slo,
	}
	return r
}

// install compiles route for the backends eps (normalized, as discovery
// leaves them), writes the route file, checks the configuration and
// reloads nginx.
func (g *rig) install(route *compiler.Route, eps []compiler.Endpoint) error {
	snap := compiler.Snapshot{Backends: endpoints.Normalize(eps)}
	res, err := compiler.Compile(route, snap, compiler.Options{SockDir: g.n.SockDir()})
	if err != nil {
		return fmt.Errorf("compile route %s: %w", route.Name, err)
	}
	conf, err := res.Outputs[0].Render(nil)
	if err != nil {
		return fmt.Errorf("render route %s: %w", route.Name, err)
	}
	return g.writeRoute(res.Outputs[0].Key, conf)
}

// writeRoute writes a route file into the routes directory and reloads.
func (g *rig) writeRoute(key string, conf []byte) error {
	if err := os.WriteFile(filepath.Join(g.n.RoutesDir(), key), conf, 0o644); err != nil {
		return err
	}
	if err := g.n.Test(); err != nil {
		return errors.New(tail(err.Error(), 15))
	}
	if err := g.n.Reload(); err != nil {
		return fmt.Errorf("reload nginx: %s", tail(err.Error(), 15))
	}
	return nil
}

// tail is s cut to its last n lines (nginx's errors carry its whole
// error log).
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) <= n {
		return s
	}
	return lines[0] + "\n…\n" + strings.Join(lines[len(lines)-n+1:], "\n")
}

// removeRoute deletes a route file (no reload: the next install reloads).
func (g *rig) removeRoute(route *compiler.Route) {
	os.Remove(filepath.Join(g.n.RoutesDir(), compiler.RouteKey(route)))
}

// chatURL is a route's chat completions endpoint through the dispatch.
func (g *rig) chatURL(route *compiler.Route) string {
	return g.n.URL(compiler.RouteName(route)) + "v1/chat/completions"
}

// podEndpoints are the endpoints of simulated pods.
func podEndpoints(pods llmsim.Pods) []compiler.Endpoint {
	eps := make([]compiler.Endpoint, 0, len(pods))
	for _, p := range pods {
		eps = append(eps, compiler.Endpoint{IP: "127.0.0.1", Port: int32(p.Port()), Ready: true})
	}
	return eps
}

// tpsStatusOf reads the route's SLO admission state through the
// dispatch (from 127.0.0.1, which the route's guard lets through).
func (g *rig) tpsStatusOf(route *compiler.Route) (nginxtest.TPSStatus, error) {
	var st nginxtest.TPSStatus
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return st, nginxtest.GetJSON(ctx, g.n.URL(compiler.RouteName(route))+"_tps_status", &st)
}

// newClient is an HTTP client keeping up to conns idle connections.
func newClient(conns int) *http.Client {
	return &http.Client{
		Timeout: 120 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns:        conns,
			MaxIdleConnsPerHost: conns,
			IdleConnTimeout:     90 * time.Second,
		},
	}
}

// logf writes a progress line to stderr.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchengine: "+format+"\n", args...)
}
