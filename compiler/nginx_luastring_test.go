package compiler

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/modelsphere/autoconfig/schema/routespec"
)

// TestNginxLongLuaStrings: nginx's lua block parser refuses a single token
// longer than its 4096-byte buffer ("too long lua code block"), so a long
// value, key or probe path must still load and read back exactly: plain
// bytes and bytes that escape to four times their length, around the
// boundaries.
func TestNginxLongLuaStrings(t *testing.T) {
	n := startNginx(t)
	values := map[string]string{}
	// Literal sizes around the one-token bound (maxLuaToken, counting
	// the quotes) and the piece size, and far beyond; eight long keys
	// in a row (the worst case measured: a long literal right after
	// another one).
	for _, size := range []int{500, 510, 511, 512, 1022, 1023, 1024, 2045, 2046, 2047, 3000, 3300, 4096, 10000, 65536} {
		plain := strings.Repeat("a", size)
		escaped := strings.Repeat("\"", size)
		values["plain_"+itoa(size)] = plain
		values["escaped_"+itoa(size)] = escaped
	}
	for i := range 8 {
		values[strings.Repeat(strconv.Itoa(i), 2046)] = strings.Repeat("v", 2046)
	}
	key := strings.Repeat("k", 5000)
	values[key] = "long key"
	probe := "/" + strings.Repeat("p", 6000)
	r := llmRoute("longstr", values, routespec.Peer{Use: "backend", Priority: 2, ProbePath: probe})
	install(t, n, r, Snapshot{Backends: []Endpoint{{IP: "10.0.0.1", Port: 8000}}})
	_, options, tiers, _ := registered(t, n.URL("longstr"))
	for k, v := range values {
		if got, ok := options[k]; !ok || got != v {
			t.Errorf("option %.20q (%d bytes): lua read %d bytes", k, len(v), len(fmt.Sprint(got)))
		}
	}
	if got := tiers[0].(map[string]any)["probe_path"]; got != probe {
		t.Errorf("probe_path: lua read %v", got)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestNginxVideoLongAPIKeys: a video route with many API keys and a key
// longer than one token still loads, and each key authenticates.
func TestNginxVideoLongAPIKeys(t *testing.T) {
	n := startNginx(t)
	be := newBackend(t, text("ok"))
	var keys []string
	for i := range 200 {
		keys = append(keys, fmt.Sprintf("sk-%03d-%s", i, strings.Repeat("x", 60)))
	}
	long := "sk-" + strings.Repeat(`"`, 3000) // escapes to 12 KB
	keys = append(keys, long)
	install(t, n, videoRoute("vidkeys", map[string]string{"api_keys": strings.Join(keys, ",")}, backendTier),
		Snapshot{Backends: []Endpoint{be.endpoint(t)}})
	for _, k := range []string{keys[0], keys[199], long} {
		if code, _, _ := do(t, nil, "GET", n.URL("vidkeys")+"v2/video_generation", map[string]string{"Authorization": "Bearer " + k}, ""); code != 200 {
			t.Errorf("key %.12q…: status %d", k, code)
		}
	}
	if code, _, _ := do(t, nil, "GET", n.URL("vidkeys")+"v2/video_generation", map[string]string{"Authorization": "Bearer sk-nope"}, ""); code != 401 {
		t.Errorf("wrong key: %d", code)
	}
}
