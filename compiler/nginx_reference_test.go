package compiler

import (
	"encoding/json"
	"testing"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
)

// TestNginxReferenceConf runs deploy/openresty/nginx.conf itself (adapted
// to Debian's nginx and a private prefix by nginxtest's Reference option)
// with a compiled three-tier FailOpen route: the dispatch server, the
// routes include and the lua path of the reference file work together. nginx -t
// does not load lua, so only real requests prove the module loads and
// registers. Two routes, each with the "lua_shared_dict <route> 10m;" the
// renderer declares, so their peer state lives in the shared dict.
func TestNginxReferenceConf(t *testing.T) {
	n := nginxtest.Start(t, nginxtest.Options{Reference: true, Workers: 2})
	a, b := newBackend(t, text("pod-a")), newBackend(t, text("pod-b"))
	dead := Endpoint{IP: "127.0.0.1", Port: refusingPort(t)}
	snap := Snapshot{Backends: []Endpoint{a.endpoint(t), b.endpoint(t), dead}, BackendService: deadVIP(t), CartService: deadVIP(t)}
	for _, route := range []string{"local", "shd"} {
		install(t, n, threeTierRoute(route, nil, backendTier), snap)
		fails, bodies := hammer(t, n.URL(route)+"v1/chat", hammerRequests)
		t.Logf("reference nginx.conf, 2 workers, route %s: %d/%d client failures (cart dead, one of 3 pods refusing), served by %v", route, fails, hammerRequests, bodies)
		if fails != 0 || bodies["pod-a"] == 0 || bodies["pod-b"] == 0 {
			t.Errorf("%s: %d failures, %v; want 0 and both live pods serving", route, fails, bodies)
		}
		code, body := nginxtest.Get(t, n.URL(route)+"_status")
		var st struct {
			Route  string `json:"route"`
			Shared bool   `json:"shared_dict"`
		}
		if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil || st.Route != route || !st.Shared {
			t.Errorf("%s: _status %d %s (%v); want shared_dict true", route, code, body, err)
		}
	}
	// With the shared dict, both workers see one ejection of the dead pod.
	for _, p := range enginePeers(t, n.URL("shd")) {
		if p.tier == "backend" && p.Port == dead.Port && (!p.Ejected || p.Ejections != 1) {
			t.Errorf("shd: dead pod %+v, want ejected once (state shared by the workers)", p)
		}
	}
}
