//go:build !linux

package main

import (
	"testing"

	"github.com/modelsphere/autoconfig/internal/readiness"
)

// TestBinaryNoProc: without /proc/net/tcp (macOS, the BSDs) the real binary
// fails open and says so: one table warning (a missing tcp6 is an empty
// table, not a failure) and the "not enforced" state.
func TestBinaryNoProc(t *testing.T) {
	p := startBinary(t, []string{"--readiness-required-listener=15008"})
	if code, body := p.get(t, "/readyz"); code != 200 || body != `{"status":"ready"}` {
		t.Fatalf("GET /readyz = %d %s, want 200 ready (fail open)", code, body)
	}
	p.stop(t)
	if p.count(readiness.MsgTableUnreadable) != 1 || p.count(readiness.MsgNotEnforced) != 1 {
		t.Errorf("want one %q and one %q:\n%s", readiness.MsgTableUnreadable, readiness.MsgNotEnforced, p.log())
	}
}
