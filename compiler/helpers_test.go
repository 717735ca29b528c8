package compiler

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/modelsphere/autoconfig/internal/endpoints"
	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// validRoute reads the route file at path and validates it under name, as
// autoconfig compile does; a route that does not validate fails the test.
func validRoute(t testing.TB, v *schema.Validator, name, path string) *Route {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := v.Validate(name, src)
	if err != nil {
		t.Fatalf("a valid route is invalid: %v", err)
	}
	return &Route{Name: obj.Name, Namespace: obj.Namespace, Spec: obj.Spec}
}

// llmRoute builds a defaulted llm route as the schema would return it.
func llmRoute(name string, values map[string]string, peers ...routespec.Peer) *Route {
	r := &Route{}
	r.Name, r.Namespace = name, "llm-route"
	r.Spec = routespec.Spec{
		ModelType: routespec.ModelTypeLLM,
		Discovery: routespec.Discovery{Service: "llm/" + name},
		Nginx: routespec.Nginx{
			Route:           name,
			Peers:           peers,
			OutputConfigMap: "openresty-conf",
			Values:          values,
		},
	}
	return r
}

// videoRoute builds a defaulted video route.
func videoRoute(name string, values map[string]string, peers ...routespec.Peer) *Route {
	r := llmRoute(name, nil, peers...)
	r.Spec.ModelType = routespec.ModelTypeVideo
	v := map[string]string{}
	for k, x := range videoDefaults {
		v[k] = x
	}
	for k, x := range values {
		v[k] = x
	}
	r.Spec.Nginx.Values = v
	return r
}

// startNginx runs a real nginx with the reference lua engine of
// deploy/openresty/lua (router.lua).
func startNginx(t *testing.T) *nginxtest.Nginx {
	t.Helper()
	return nginxtest.Start(t, nginxtest.Options{LuaPackagePath: nginxtest.RouterLuaPath()})
}

// install compiles route against snap (normalised, as discovery leaves it)
// for n's socket dir, writes the route file and reloads nginx.
func install(t *testing.T, n *nginxtest.Nginx, route *Route, snap Snapshot) Result {
	t.Helper()
	res, err := Compile(route, normalized(snap), Options{SockDir: n.SockDir()})
	if err != nil {
		t.Fatal(err)
	}
	conf, err := res.Outputs[0].Render(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.RoutesDir(), res.Outputs[0].Key), conf, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.Test(); err != nil {
		t.Fatalf("%v\nroute file:\n%s", err, conf)
	}
	if err := n.Reload(); err != nil {
		t.Fatalf("%v\nroute file:\n%s", err, conf)
	}
	return res
}

// refusingPort returns a loopback port nothing listens on (connect gets
// ECONNREFUSED).
func refusingPort(t *testing.T) int32 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return int32(port)
}

// hostPort splits a test server's 127.0.0.1:port.
func hostPort(t *testing.T, addr string) (string, int32) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return h, int32(n)
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// clone is a deep copy of r, so a test can change it freely.
func clone(r *Route) *Route {
	c := *r
	r.Spec.DeepCopyInto(&c.Spec)
	return &c
}

// normalized puts the snapshot's endpoint lists in the normal form Compile
// requires, with the function discovery uses (discovery.NormalizeSnapshot
// does the same; the compiler's tests cannot import discovery).
func normalized(s Snapshot) Snapshot {
	s.Backends = endpoints.Normalize(s.Backends)
	s.CartPods = endpoints.Normalize(s.CartPods)
	s.NginxPods = endpoints.Normalize(s.NginxPods)
	s.CanaryBackends = endpoints.Normalize(s.CanaryBackends)
	return s
}
