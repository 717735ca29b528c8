package compiler

import (
	"slices"
	"testing"

	"github.com/modelsphere/autoconfig/schema/routespec"
)

// TestOwnerMarks: every output of every valid route names its route in a
// mark ReadContent reads back, and rendering over another route's CART
// config.yaml leaves exactly one mark (the new owner's).
func TestOwnerMarks(t *testing.T) {
	_, routes, rels, snap, base := goldenInputs(t)
	for _, rel := range rels {
		route := routes[rel]
		res, err := Compile(route, snap, Options{})
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		want := OwnerRef(route.Namespace, route.Name)
		for _, o := range res.Outputs {
			b, err := o.Render(base)
			if err != nil {
				t.Fatal(err)
			}
			c := ReadContent(o.Key, b)
			if c.Owner != want || c.Free {
				t.Errorf("%s %s: owner %q free %v, want %q", rel, o.Key, c.Owner, c.Free, want)
			}
			if o.Key == CartKey {
				other := &Route{Name: "other", Namespace: "elsewhere", Spec: route.Spec}
				res2, err := Compile(other, snap, Options{})
				if err != nil {
					t.Fatal(err)
				}
				b2, err := res2.Outputs[slices.IndexFunc(res2.Outputs, func(o Output) bool { return o.Key == CartKey })].Render(b)
				if err != nil {
					t.Fatal(err)
				}
				if c := ReadContent(CartKey, b2); c.Owner != "elsewhere/other" {
					t.Errorf("%s: taken over CART config owner %q", rel, c.Owner)
				}
				if n := countMarks(string(b2)); n != 1 {
					t.Errorf("%s: %d marks after a take-over:\n%s", rel, n, b2)
				}
			}
		}
	}
}

func countMarks(s string) int {
	n := 0
	for i := 0; i+len(markPrefix) <= len(s); i++ {
		if s[i:i+len(markPrefix)] == markPrefix {
			n++
		}
	}
	return n
}

// TestReadContent: what a value says about who may write it.
func TestReadContent(t *testing.T) {
	for _, c := range []struct {
		name, key, value string
		want             Content
	}{
		{"route file", "session_route_a.conf", "# session_route_a.conf: written by autoconfig from ModelRoute ns/a; do not edit.\nserver {}\n", Content{Owner: "ns/a"}},
		{"route file, other key's mark", "session_route_b.conf", "# session_route_a.conf: written by autoconfig from ModelRoute ns/a; do not edit.\n", Content{}},
		{"hand-written", "session_route_a.conf", "server { listen 80; }\n", Content{}},
		{"mark not on the first line", "session_route_a.conf", "\n# session_route_a.conf: written by autoconfig from ModelRoute ns/a; do not edit.\n", Content{}},
		{"monitor", "Org_M.monitor.conf", "# Org_M.monitor.conf: written by autoconfig from ModelRoute t1/m; do not edit.\nservice: x\n", Content{Owner: "t1/m"}},
		{"cart placeholder", CartKey, "server:\n  port: 1\nworkers: []\n", Content{Free: true}},
		{"cart null workers", CartKey, "server:\n  port: 1\nworkers:\n", Content{Free: true}},
		{"cart hand-written workers", CartKey, "workers:\n  - url: http://10.0.0.1:80\n    max_load: 5\n", Content{Workers: []string{"http://10.0.0.1:80"}}},
		{"cart owned", CartKey, "server: {}\n# chart comment\n# workers: written by autoconfig from ModelRoute ns/a; do not edit.\nworkers:\n  - url: http://10.0.0.1:80\n", Content{Owner: "ns/a", Workers: []string{"http://10.0.0.1:80"}}},
		{"cart first key owned", CartKey, "# workers: written by autoconfig from ModelRoute ns/a; do not edit.\nworkers:\n  - url: http://10.0.0.1:80\n", Content{Owner: "ns/a", Workers: []string{"http://10.0.0.1:80"}}},
		{"another app's config.yaml", CartKey, "log_level: debug\nlisten: 8080\n", Content{}},
		{"workers not a list", CartKey, "workers: 3\n", Content{}},
		{"not yaml", CartKey, "a: [\n", Content{}},
	} {
		got := ReadContent(c.key, []byte(c.value))
		if got.Owner != c.want.Owner || got.Free != c.want.Free || !slices.Equal(got.Workers, c.want.Workers) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestCartMarkFirstKey: the mark is read back when workers is the first
// key (yaml.v3 may attach a document's first comment elsewhere) and when
// the chart wrote a line comment after workers.
func TestCartMarkFirstKey(t *testing.T) {
	w := []CartWorker{{URL: "http://10.0.0.1:8000", MaxLoad: 20}}
	for _, base := range []string{"workers: []\nserver: {}\n", "# top\nworkers: [] # filled\n", cartBase, "server: {}\n"} {
		b, err := RenderCartConfig([]byte(base), w, "ns/cart", "ns/r")
		if err != nil {
			t.Fatal(err)
		}
		if c := ReadContent(CartKey, b); c.Owner != "ns/r" {
			t.Errorf("base %q: owner %q in\n%s", base, c.Owner, b)
		}
		again, _ := RenderCartConfig(b, w, "ns/cart", "ns/r")
		if string(again) != string(b) {
			t.Errorf("base %q: second render differs:\n%s\n%s", base, b, again)
		}
	}
}

// TestReadContentPeersTable: a peers table's owner field is its mark; a
// value that is not a table (hand-written) has no owner.
func TestReadContentPeersTable(t *testing.T) {
	route := &Route{Name: "qwen", Namespace: "llm", Spec: routespec.Spec{ModelType: routespec.ModelTypeVideo,
		Discovery: routespec.Discovery{Service: "qwen"},
		Nginx:     routespec.Nginx{OutputConfigMap: "routes", Peers: []routespec.Peer{{Use: routespec.UseBackend}}}}}
	res, err := Compile(route, Snapshot{Backends: []Endpoint{{IP: "10.0.0.1", Port: 8000, Ready: true}}}, Options{DynamicPeers: true})
	if err != nil {
		t.Fatal(err)
	}
	var table []byte
	for _, o := range res.Outputs {
		if o.Key == PeersKey(route) {
			table, _ = o.Render(nil)
		}
	}
	if got := ReadContent(PeersKey(route), table).Owner; got != "llm/qwen" {
		t.Fatalf("owner %q, want llm/qwen", got)
	}
	for _, v := range []string{"", "# hand-written\n", `{"route":"qwen"}`, `{"owner":"a b"}`} {
		if got := ReadContent(PeersKey(route), []byte(v)).Owner; got != "" {
			t.Errorf("%q: owner %q, want none", v, got)
		}
	}
}

// TestKnownConfigMap: a ConfigMap reference resolves offline only when the
// result does not depend on where the route is applied.
func TestKnownConfigMap(t *testing.T) {
	for _, c := range []struct {
		namespace, ref, want string
		ok                   bool
	}{
		{"llm-route", "openresty-conf", "llm-route/openresty-conf", true},
		{"llm-route", "other/openresty-conf", "other/openresty-conf", true},
		{"", "other/openresty-conf", "other/openresty-conf", true},
		{"", "openresty-conf", "", false},
		{"llm-route", "", "", false},
	} {
		got, ok := KnownConfigMap(&Route{Name: "q", Namespace: c.namespace}, c.ref)
		if got != c.want || ok != c.ok {
			t.Errorf("KnownConfigMap(namespace %q, %q) = %q, %v; want %q, %v", c.namespace, c.ref, got, ok, c.want, c.ok)
		}
	}
}
