package routespec

import "testing"

func TestSplitRef(t *testing.T) {
	for _, c := range []struct{ ref, ns, wantNS, wantName string }{
		{"llm/qwen", "x", "llm", "qwen"},
		{"qwen", "llm-route", "llm-route", "qwen"},
		{"qwen", "", "default", "qwen"},
	} {
		if ns, n := SplitRef(c.ref, c.ns); ns != c.wantNS || n != c.wantName {
			t.Errorf("SplitRef(%q, %q) = %s, %s; want %s, %s", c.ref, c.ns, ns, n, c.wantNS, c.wantName)
		}
	}
	if k := RefKey("qwen", "llm-route"); k != "llm-route/qwen" {
		t.Errorf("RefKey = %s", k)
	}
}

func TestSameBackends(t *testing.T) {
	svc := func(s string, port int32) Discovery { return Discovery{Service: s, Port: port} }
	sel := func(s string, port int32) Discovery { return Discovery{Selector: s, Port: port} }
	for _, c := range []struct {
		name           string
		stable, canary Discovery
		ns             string
		want           bool
	}{
		{"same bare name", svc("qwen", 0), svc("qwen", 0), "llm", true},
		{"same ns/name", svc("llm/qwen", 0), svc("llm/qwen", 0), "", true},
		{"bare name in the route's namespace", svc("qwen", 0), svc("llm/qwen", 0), "llm", true},
		{"the other way round", svc("llm/qwen", 0), svc("qwen", 0), "llm", true},
		{"bare name in another namespace", svc("qwen", 0), svc("llm/qwen", 0), "other", false},
		{"no namespace: where the bare name lands is unknown", svc("qwen", 0), svc("default/qwen", 0), "", false},
		{"other Service", svc("llm/qwen", 0), svc("llm/qwen-v2", 0), "llm", false},
		{"same Service, one port", svc("qwen", 8000), svc("qwen", 0), "llm", true},
		{"same Service, same port", svc("qwen", 8000), svc("llm/qwen", 8000), "llm", true},
		{"same Service, other ports", svc("qwen", 8000), svc("llm/qwen", 8001), "llm", false},
		{"same selector", sel("app=qwen", 0), sel("app=qwen", 0), "llm", true},
		{"other selector", sel("app=qwen", 0), sel("app=qwen-v2", 0), "llm", false},
		{"same selector, other ports", sel("app=qwen", 1), sel("app=qwen", 2), "llm", false},
		{"a Service and a selector", svc("qwen", 0), sel("app=qwen", 0), "llm", false},
	} {
		if got := SameBackends(c.stable, c.canary, c.ns); got != c.want {
			t.Errorf("%s: SameBackends(%+v, %+v, %q) = %v, want %v", c.name, c.stable, c.canary, c.ns, got, c.want)
		}
	}
}
