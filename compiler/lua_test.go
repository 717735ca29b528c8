package compiler

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
)

// luaLiteralRE is everything LuaString may produce: a double-quoted string of
// safe bytes and three-digit decimal escapes. No quote, '\' (other than an
// escape), brace, ';', '#', '$', bracket, newline or non-ASCII byte can
// reach nginx's lexer, so the literal can end neither the string, nor the
// directive, nor the *_by_lua_block.
var luaLiteralRE = regexp.MustCompile(`^"([A-Za-z0-9 _\-.,:/@+=]|\\[0-9]{3})*"$`)

func TestLuaStringForm(t *testing.T) {
	for _, s := range append(append([]string{allBytes()}, hostileStrings...), randomHostile(7, 500)...) {
		q := LuaString(s)
		if !luaLiteralRE.MatchString(q) {
			t.Fatalf("LuaString(%q) = %s: outside the safe form", s, q)
		}
	}
	if got := LuaString("a\"b\n1"); got != `"a\034b\0101"` {
		t.Fatalf("LuaString: got %s", got)
	}
}

// luaEval serves a route whose lua loads POSTed source as "return <body>"
// and answers the resulting string's bytes: a real LuaJIT (nginx's) reads
// each literal.
const luaEvalConf = `server {
    listen unix:%SOCK%;
    client_body_buffer_size 1m;
    client_max_body_size 1m;
    location / {
        content_by_lua_block {
            ngx.req.read_body()
            local src = ngx.req.get_body_data() or ""
            local f, err = loadstring("return " .. src, "=literal")
            if not f then
                ngx.status = 400
                return ngx.say("syntax: ", err)
            end
            local ok, v = pcall(f)
            if not ok or type(v) ~= "string" then
                ngx.status = 400
                return ngx.say("eval: ", tostring(v))
            end
            ngx.print(v)
        }
    }
}
`

func startLuaEval(t testing.TB) func(t *testing.T, s string) {
	n := nginxtest.Start(t, nginxtest.Options{})
	conf := bytes.ReplaceAll([]byte(luaEvalConf), []byte("%SOCK%"), []byte(n.SockPath("lua-eval")))
	if err := os.WriteFile(filepath.Join(n.RoutesDir(), "session_route_lua-eval.conf"), conf, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	url := n.URL("lua-eval")
	return func(t *testing.T, s string) {
		t.Helper()
		q := LuaString(s)
		if !luaLiteralRE.MatchString(q) {
			t.Fatalf("LuaString(%q) = %s: outside the safe form", s, q)
		}
		resp, err := http.Post(url, "application/octet-stream", bytes.NewReader([]byte(q)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("lua rejected %s (from %q): %d %s", q, s, resp.StatusCode, b)
		}
		if string(b) != s {
			t.Fatalf("lua read %q from %s, want %q", b, q, s)
		}
	}
}

// FuzzLuaString checks that every string survives LuaString → real LuaJIT
// (inside nginx) byte for byte. The seed corpus (hostile strings and
// testdata/fuzz/FuzzLuaString) runs in plain `go test`; explore with
//
//	go test -run '^$' -fuzz FuzzLuaString ./compiler
func FuzzLuaString(f *testing.F) {
	f.Add(allBytes())
	for _, s := range hostileStrings {
		f.Add(s)
	}
	eval := startLuaEval(f)
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 64<<10 {
			t.Skip("longer than the eval server's body limit")
		}
		eval(t, s)
	})
}
