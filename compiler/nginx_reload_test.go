package compiler

import (
	"testing"

	"github.com/modelsphere/autoconfig/schema/routespec"
)

// TestNginxSpecChangesReload: nginx keeps a shared memory zone across a
// reload only with the same key, and refuses the reload of the whole
// shared http{} otherwise ("limit_conn_zone … uses the "$b" key while
// previously it used the "$a" key"), which nginx -t, a fresh process,
// does not see. Every value a user may change on a live route must reload:
// the limit key, the request rate, the shared dict size.
func TestNginxSpecChangesReload(t *testing.T) {
	n := startNginx(t)
	be := newBackend(t, text("ok"))
	snap := Snapshot{Backends: []Endpoint{be.endpoint(t)}}
	for _, vals := range []map[string]string{
		{"upload_conn_limit": "5", "upload_req_limit": "10r/s"},
		{"upload_conn_limit": "5", "upload_req_limit": "10r/s", "upload_limit_key": "$http_x_forwarded_for"},
		{"upload_conn_limit": "5", "upload_req_limit": "20r/s", "upload_limit_key": "$binary_remote_addr"},
		{"upload_conn_limit": "6", "upload_req_limit": "30r/s", "upload_limit_key": "$binary_remote_addr"},
		{"upload_conn_limit": "6", "upload_req_limit": "40r/s"},
	} {
		install(t, n, videoRoute("zones", vals, backendTier), snap) // fails on a refused reload
		if code, _, _ := do(t, nil, "GET", n.URL("zones")+"v2/video_generation", nil, ""); code != 200 {
			t.Errorf("%v: status %d", vals, code)
		}
	}
	for _, size := range []string{"10m", "1m", "20m", "10m"} {
		install(t, n, llmRoute("dict", map[string]string{SharedDictSizeKey: size}, routespec.Peer{Use: "backend", Priority: 2}), snap)
	}
}
