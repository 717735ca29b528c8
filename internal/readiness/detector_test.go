package readiness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestFixtures(t *testing.T) {
	tests := []struct {
		root       string
		ports      []int
		state      State
		missing    []int
		unreadable []string // table names under the root
		logMsg     string
	}{
		{root: "listen-tcp", ports: []int{15008}, state: StatePresent, logMsg: MsgPresent},
		{root: "listen-tcp6", ports: []int{15008}, state: StatePresent, logMsg: MsgPresent},
		{root: "listen-tcp", ports: []int{15008, 8080, 8081}, state: StatePresent, logMsg: MsgPresent},
		{root: "established", ports: []int{15008}, state: StateMissing, missing: []int{15008}, logMsg: MsgMissing},
		{root: "established", ports: []int{8080, 15008}, state: StateMissing, missing: []int{15008}, logMsg: MsgMissing},
		{root: "other-port", ports: []int{15008}, state: StateMissing, missing: []int{15008}, logMsg: MsgMissing},
		{root: "no-tcp6", ports: []int{15008}, state: StatePresent, logMsg: MsgPresent},
		{root: "no-tcp6-missing", ports: []int{15008}, state: StateMissing, missing: []int{15008}, logMsg: MsgMissing},
		{root: "header-only", ports: []int{15008}, state: StateMissing, missing: []int{15008}, logMsg: MsgMissing},
		{root: "no-tcp", ports: []int{15008}, state: StateNotEnforced, unreadable: []string{"tcp"}, logMsg: MsgNotEnforced},
		{root: "no-tcp", ports: []int{8080}, state: StateNotEnforced, missing: []int{8080}, unreadable: []string{"tcp"}, logMsg: MsgNotEnforced},
		// The port is seen in tcp, but tcp6 is unreadable: ready, and
		// "not enforced" rather than "present".
		{root: "unreadable-tcp6", ports: []int{15008}, state: StateNotEnforced, unreadable: []string{"tcp6"}, logMsg: MsgNotEnforced},
		{root: "unreadable-tcp", ports: []int{15008}, state: StateNotEnforced, missing: []int{15008}, unreadable: []string{"tcp"}, logMsg: MsgNotEnforced},
		{root: "bad-header", ports: []int{15008}, state: StateNotEnforced, missing: []int{15008}, unreadable: []string{"tcp"}, logMsg: MsgNotEnforced},
		{root: "malformed-row", ports: []int{15008}, state: StateNotEnforced, missing: []int{15008}, unreadable: []string{"tcp6"}, logMsg: MsgNotEnforced},
		{root: "bad-port", ports: []int{15008}, state: StateNotEnforced, missing: []int{15008}, unreadable: []string{"tcp"}, logMsg: MsgNotEnforced},
		// The tcp6 LISTEN row is found, but tcp has no header at all.
		{root: "empty-tcp", ports: []int{15008}, state: StateNotEnforced, unreadable: []string{"tcp"}, logMsg: MsgNotEnforced},
		{root: "does-not-exist", ports: []int{15008}, state: StateNotEnforced, missing: []int{15008}, unreadable: []string{"tcp"}, logMsg: MsgNotEnforced},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.root, tc.ports), func(t *testing.T) {
			root := fixtureRoot(tc.root)
			var sink logSink
			clock := newFakeClock()
			d, err := NewDetector(Options{ProcRoot: root, Ports: tc.ports, Clock: clock, Logger: sink.logger()})
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, name := range tc.unreadable {
				want = append(want, root+"/net/"+name)
			}
			// Three checks with fresh scans: the state line is logged once.
			for i := range 3 {
				r := d.Check(context.Background())
				if r.State != tc.state || r.Ready != (tc.state != StateMissing) || r.Enforced != (len(tc.unreadable) == 0) {
					t.Fatalf("check %d: got state %v ready %v enforced %v, want %v", i, r.State, r.Ready, r.Enforced, tc.state)
				}
				if !slices.Equal(r.Missing, tc.missing) {
					t.Errorf("check %d: missing %v, want %v", i, r.Missing, tc.missing)
				}
				if !slices.Equal(r.Unreadable, want) {
					t.Errorf("check %d: unreadable %v, want %v", i, r.Unreadable, want)
				}
				clock.Advance(DefaultTTL)
			}
			if got := d.Scans(); got != 3 {
				t.Errorf("scans = %d, want 3", got)
			}
			for _, msg := range stateMsgs {
				n := sink.count(t, msg)
				if msg == tc.logMsg && n != 1 {
					t.Errorf("%q logged %d times, want once; log:\n%s", msg, n, sink.String())
				}
				if msg != tc.logMsg && n != 0 {
					t.Errorf("%q logged %d times, want never; log:\n%s", msg, n, sink.String())
				}
			}
			if n := sink.count(t, MsgTableUnreadable); n != len(tc.unreadable) {
				t.Errorf("%q logged %d times, want %d (once per unreadable table); log:\n%s", MsgTableUnreadable, n, len(tc.unreadable), sink.String())
			}
			if tc.state == StateNotEnforced {
				line := sink.only(t, MsgNotEnforced)
				if fmt.Sprint(line["unreadable"]) != fmt.Sprint(want) {
					t.Errorf("not enforced line names unreadable %v, want %v", line["unreadable"], want)
				}
				if fmt.Sprint(line["ports"]) != fmt.Sprint(tc.ports) {
					t.Errorf("not enforced line names ports %v, want %v", line["ports"], tc.ports)
				}
			}
			if tc.state == StateMissing {
				line := sink.only(t, MsgMissing)
				if fmt.Sprint(line["missing"]) != fmt.Sprint(tc.missing) {
					t.Errorf("missing line names %v, want %v", line["missing"], tc.missing)
				}
			}
		})
	}
}

// copyFixture copies a fixture case into a temporary proc root the test
// can change.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	dst := t.TempDir()
	if err := os.CopyFS(dst, os.DirFS(fixtureRoot(name))); err != nil {
		t.Fatal(err)
	}
	return dst
}

func replaceTable(t *testing.T, root, table, fromCase string) {
	t.Helper()
	path := filepath.Join(root, "net", table)
	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
	if fromCase == "" {
		return
	}
	src := filepath.Join(fixtureRoot(fromCase), "net", table)
	fi, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	if fi.IsDir() {
		if err := os.Mkdir(path, 0o755); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestTransitions walks one detector through every state and back, and
// checks that each line is logged once per transition, including the
// table recovery line.
func TestTransitions(t *testing.T) {
	root := copyFixture(t, "other-port")
	var sink logSink
	clock := newFakeClock()
	d, err := NewDetector(Options{ProcRoot: root, Ports: []int{15008}, Clock: clock, Logger: sink.logger()})
	if err != nil {
		t.Fatal(err)
	}
	step := func(wantState State) {
		t.Helper()
		for range 2 {
			clock.Advance(DefaultTTL)
			if r := d.Check(context.Background()); r.State != wantState {
				t.Fatalf("state %v, want %v (result %+v)", r.State, wantState, r)
			}
		}
	}
	counts := func(present, missing, notEnforced, unreadable, recovered int) {
		t.Helper()
		for msg, want := range map[string]int{MsgPresent: present, MsgMissing: missing, MsgNotEnforced: notEnforced, MsgTableUnreadable: unreadable, MsgTableRecovered: recovered} {
			if got := sink.count(t, msg); got != want {
				t.Errorf("%q logged %d times, want %d; log:\n%s", msg, got, want, sink.String())
			}
		}
	}

	step(StateMissing)
	counts(0, 1, 0, 0, 0)

	replaceTable(t, root, "tcp6", "listen-tcp6")
	step(StatePresent)
	counts(1, 1, 0, 0, 0)

	// tcp becomes unreadable while the port is still seen in tcp6.
	replaceTable(t, root, "tcp", "unreadable-tcp")
	step(StateNotEnforced)
	counts(1, 1, 1, 1, 0)

	// tcp6 goes too: the same state with another unreadable table is a new
	// transition, and the first table is not logged again.
	replaceTable(t, root, "tcp6", "unreadable-tcp6")
	step(StateNotEnforced)
	counts(1, 1, 2, 2, 0)

	// Both recover, and the port is gone.
	replaceTable(t, root, "tcp", "other-port")
	replaceTable(t, root, "tcp6", "other-port")
	step(StateMissing)
	counts(1, 2, 2, 2, 2)

	// tcp6 disappears (ipv6 disabled) and tcp gets the listener.
	replaceTable(t, root, "tcp6", "")
	replaceTable(t, root, "tcp", "listen-tcp")
	step(StatePresent)
	counts(2, 2, 2, 2, 2)

	var recovered []string
	for _, r := range sink.records(t) {
		if r["msg"] == MsgTableRecovered {
			recovered = append(recovered, r["table"].(string))
		}
	}
	slices.Sort(recovered)
	if want := []string{root + "/net/tcp", root + "/net/tcp6"}; !slices.Equal(recovered, want) {
		t.Errorf("recovered tables %v, want %v", recovered, want)
	}
}

func TestNoPortsAlwaysReady(t *testing.T) {
	var sink logSink
	d, err := NewDetector(Options{ProcRoot: fixtureRoot("does-not-exist"), Logger: sink.logger()})
	if err != nil {
		t.Fatal(err)
	}
	r := d.Check(context.Background())
	if !r.Ready || r.State != StateNotRequired {
		t.Fatalf("got %+v, want ready / not required", r)
	}
	if d.Scans() != 0 || sink.String() != "" {
		t.Errorf("scans %d, log %q: want no scan and no log with no ports", d.Scans(), sink.String())
	}
}

func TestValidatePorts(t *testing.T) {
	sixteen := make([]int, 16)
	for i := range sixteen {
		sixteen[i] = 1000 + i
	}
	for _, tc := range []struct {
		ports []int
		err   string
	}{
		{ports: nil},
		{ports: []int{1, 65535}},
		{ports: sixteen},
		{ports: []int{0}, err: "out of range"},
		{ports: []int{65536}, err: "out of range"},
		{ports: []int{-1}, err: "out of range"},
		{ports: []int{15008, 8080, 15008}, err: "listed twice"},
		{ports: append(slices.Clone(sixteen), 2000), err: "at most 16"},
	} {
		err := ValidatePorts(tc.ports)
		if tc.err == "" && err != nil {
			t.Errorf("%v: %v", tc.ports, err)
		}
		if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%v: error %v, want one containing %q", tc.ports, err, tc.err)
		}
		if _, nerr := NewDetector(Options{Ports: tc.ports}); (nerr == nil) != (err == nil) {
			t.Errorf("%v: NewDetector error %v disagrees with ValidatePorts %v", tc.ports, nerr, err)
		}
	}
	if _, err := NewDetector(Options{Ports: []int{1}, TTL: -1}); err == nil {
		t.Error("negative TTL accepted")
	}
}

func TestParseRow(t *testing.T) {
	for _, tc := range []struct {
		line   string
		port   uint16
		listen bool
		err    bool
	}{
		{line: "   0: 00000000:3AA0 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1460 1", port: 0x3AA0, listen: true},
		{line: "   0: 00000000:3aa0 00000000:0000 0a 00000000:00000000", port: 0x3AA0, listen: true},
		{line: "   1: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 0", port: 80, listen: true},
		{line: "   2: 0500F40A:3AA0 0900F40A:C350 01 00000000:00000000", listen: false},
		{line: "   3: 0500F40A:3AA0 0900F40A:C350 06", listen: false},
		{line: "      ", listen: false},
		{line: "   4: 0500F40A:3AA0 0900F40A:C350", err: true},
		{line: "   5: 0500F40A:3AA0 0900F40A:C350 XY 0", err: true},
		{line: "   6: 0500F40A3AA0 0900F40A:C350 0A 0", err: true},
		{line: "   7: 0500F40A:13AA0 0900F40A:C350 0A 0", err: true},
		{line: "   8: 0500F40A: 0900F40A:C350 0A 0", err: true},
		{line: "   9: 0500F40A:3AG0 0900F40A:C350 0A 0", err: true},
		{line: "  10: 0500F:40A:3AA0 0900F40A:C350 0A 0", err: true},
	} {
		port, listen, err := parseRow([]byte(tc.line))
		if (err != nil) != tc.err || port != tc.port || listen != tc.listen {
			t.Errorf("%q: got %#x %v %v, want %#x %v err=%v", tc.line, port, listen, err, tc.port, tc.listen, tc.err)
		}
	}
}
