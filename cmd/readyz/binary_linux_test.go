//go:build linux

package main

import (
	"fmt"
	"strconv"
	"syscall"
	"testing"

	"github.com/modelsphere/autoconfig/internal/readiness"
)

// reservePort binds a TCP socket on 127.0.0.1 without listening, so the
// port is ours (nothing else can take it) yet has no LISTEN row in
// /proc/net/tcp. It returns the fd and the port.
func reservePort(t *testing.T) (int, int) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fd, sa.(*syscall.SockaddrInet4).Port
}

// TestBinaryReservedPort runs the real binary against this machine's /proc:
// 503 while the required port is only bound, 200 once the same socket
// listens. The port is given by flag and, in a second run, by environment.
func TestBinaryReservedPort(t *testing.T) {
	for _, how := range []string{"flag", "env"} {
		t.Run(how, func(t *testing.T) {
			fd, port := reservePort(t)
			var p *proc
			if how == "flag" {
				p = startBinary(t, []string{"--readiness-required-listener", strconv.Itoa(port)})
			} else {
				p = startBinary(t, nil, "PS_READINESS_REQUIRED_LISTENERS="+strconv.Itoa(port))
			}

			code, body := p.get(t, "/readyz")
			if want := fmt.Sprintf(`{"status":"not ready","missingListeners":[%d]}`, port); code != 503 || body != want {
				t.Fatalf("bound, not listening: GET /readyz = %d %s, want 503 %s\n%s", code, body, want, p.log())
			}
			for _, path := range []string{"/health", "/healthz"} {
				if code, body := p.get(t, path); code != 200 {
					t.Errorf("GET %s = %d %s while not ready, want 200", path, code, body)
				}
			}

			if err := syscall.Listen(fd, 16); err != nil {
				t.Fatal(err)
			}
			if body := p.waitStatus(t, "/readyz", 200); body != `{"status":"ready"}` {
				t.Errorf("listening: body %s", body)
			}
			p.stop(t)

			for msg, want := range map[string]int{readiness.MsgMissing: 1, readiness.MsgPresent: 1, readiness.MsgNotEnforced: 0, readiness.MsgTableUnreadable: 0} {
				if got := p.count(msg); got != want {
					t.Errorf("%q logged %d times, want %d\n%s", msg, got, want, p.log())
				}
			}
		})
	}
}
