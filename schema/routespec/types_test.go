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
