package reload

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// shortTempDir keeps unix socket paths under the 108-byte limit.
func shortTempDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "rl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func listenUnix(t *testing.T, path string) *net.UnixListener {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// staleSocket leaves a socket file nothing listens on, as a SIGKILLed
// nginx master does.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	l := listenUnix(t, path)
	l.SetUnlinkOnClose(false)
	l.Close()
}

func TestCleanSockets(t *testing.T) {
	sock := shortTempDir(t)
	conf := t.TempDir()
	route := func(name string) string { return "server {\n    listen unix:/elsewhere/sock/" + name + ".sock;\n}\n" }
	os.WriteFile(filepath.Join(conf, "session_route_a.conf"), []byte(route("a")), 0o644)
	os.WriteFile(filepath.Join(conf, "session_route_b.conf"), []byte(route("b")), 0o644)
	os.WriteFile(filepath.Join(conf, "notes.txt"), []byte(route("z")), 0o644) // not *.conf: nginx ignores it

	listenUnix(t, filepath.Join(sock, "a.sock"))            // referenced, live
	staleSocket(t, filepath.Join(sock, "b.sock"))           // referenced, stale (crash)
	listenUnix(t, filepath.Join(sock, "c.sock"))            // unreferenced, live (removed route, reload pending)
	staleSocket(t, filepath.Join(sock, "d.sock"))           // unreferenced, stale
	staleSocket(t, filepath.Join(sock, "z.sock"))           // only in a non-.conf file: unreferenced, stale
	os.WriteFile(filepath.Join(sock, "e.sock"), nil, 0o644) // not a socket: never touched

	refs, err := ReferencedSockets([]string{conf})
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) != 2 || !refs["a.sock"] || !refs["b.sock"] {
		t.Fatalf("referenced: got %v, want a.sock and b.sock", refs)
	}
	acts, err := CleanSockets(sock, refs)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]SocketAction{}
	for _, a := range acts {
		got[filepath.Base(a.Path)] = a
	}
	for name, want := range map[string]struct {
		removed, referenced bool
		state               SocketState
	}{
		"a.sock": {false, true, SocketLive},
		"b.sock": {true, true, SocketStale},
		"c.sock": {false, false, SocketLive},
		"d.sock": {true, false, SocketStale},
		"z.sock": {true, false, SocketStale},
	} {
		a := got[name]
		if a.Removed != want.removed || a.Referenced != want.referenced || a.State != want.state {
			t.Errorf("%s: got %+v, want %+v", name, a, want)
		}
		_, err := os.Lstat(filepath.Join(sock, name))
		if exists := err == nil; exists == want.removed {
			t.Errorf("%s: exists=%v after cleanup, want removed=%v", name, exists, want.removed)
		}
	}
	if _, ok := got["e.sock"]; ok {
		t.Error("a regular file named .sock was considered")
	}
	if _, err := os.Stat(filepath.Join(sock, "e.sock")); err != nil {
		t.Errorf("regular file removed: %v", err)
	}
	// The live sockets still accept connections.
	for _, n := range []string{"a.sock", "c.sock"} {
		c, err := net.Dial("unix", filepath.Join(sock, n))
		if err != nil {
			t.Errorf("%s no longer accepts: %v", n, err)
			continue
		}
		c.Close()
	}
}
