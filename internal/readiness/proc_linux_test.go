//go:build linux

package readiness

import (
	"context"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestRealProc checks the detector against this machine's own /proc: a
// socket the test listens on is found, and is missing once closed.
func TestRealProc(t *testing.T) {
	for _, network := range []struct{ net, addr string }{{"tcp4", "127.0.0.1:0"}, {"tcp6", "[::1]:0"}} {
		t.Run(network.net, func(t *testing.T) {
			ln, err := net.Listen(network.net, network.addr)
			if err != nil {
				if network.net == "tcp6" {
					// IPv6 can be disabled on a CI host; the tcp4 case
					// still covers the real table.
					t.Skipf("no IPv6 loopback here: %v", err)
				}
				t.Fatal(err)
			}
			port := ln.Addr().(*net.TCPAddr).Port
			clock := newFakeClock()
			var sink logSink
			d, err := NewDetector(Options{Ports: []int{port}, Clock: clock, Logger: sink.logger()})
			if err != nil {
				t.Fatal(err)
			}
			if r := d.Check(context.Background()); r.State != StatePresent {
				t.Fatalf("listening on %d: got %+v, want present", port, r)
			}
			ln.Close()
			clock.Advance(DefaultTTL)
			if r := d.Check(context.Background()); r.State != StateMissing {
				t.Fatalf("closed %d: got %+v, want missing", port, r)
			}
		})
	}
}

// TestFifoTable puts a fifo where tcp6 should be. A blocking open of a fifo
// with no writer never returns, which would wedge every caller; the table
// is reported unreadable instead.
func TestFifoTable(t *testing.T) {
	root := copyFixture(t, "listen-tcp")
	tcp6 := filepath.Join(root, "net", "tcp6")
	replaceTable(t, root, "tcp6", "")
	if err := syscall.Mkfifo(tcp6, 0o644); err != nil {
		t.Fatal(err)
	}
	var sink logSink
	d, err := NewDetector(Options{ProcRoot: root, Ports: []int{15008}, Clock: newFakeClock(), Logger: sink.logger()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan Result, 1)
	go func() { done <- d.Check(context.Background()) }()
	select {
	case r := <-done:
		if r.State != StateNotEnforced || len(r.Unreadable) != 1 || r.Unreadable[0] != tcp6 {
			t.Fatalf("got %+v, want not enforced with %s unreadable", r, tcp6)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("check blocked on a fifo table")
	}
	sink.only(t, MsgTableUnreadable)
	sink.only(t, MsgNotEnforced)
}
