package reload

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// writeProc writes one /proc/<pid> fixture in the kernel's format: cmdline
// is NUL-separated and NUL-terminated, stat is "pid (comm) state ppid …"
// with all 52 fields of a current kernel (procfs reads them all).
func writeProc(t *testing.T, root string, pid int, comm string, state byte, ppid int, argv ...string) {
	t.Helper()
	d := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	var cmdline string
	for _, a := range argv {
		cmdline += a + "\x00"
	}
	stat := strconv.Itoa(pid) + " (" + comm + ") " + string(state) + " " + strconv.Itoa(ppid) +
		" 2949 2949 0 -1 4194560 1046 0 0 0 3 1 0 0 20 0 1 0 1227 10002432 1331 18446744073709551615" +
		" 94355 94360 140736 0 0 0 0 4096 16386 0 0 0 17 3 0 0 0 0 0 94361 94362 94363 140737 140738 140739 140740 0\n"
	if err := os.WriteFile(filepath.Join(d, "cmdline"), []byte(cmdline), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "stat"), []byte(stat), 0o444); err != nil {
		t.Fatal(err)
	}
}

func procFixture(t *testing.T) string {
	root := t.TempDir()
	writeProc(t, root, 1, "pause", 'S', 0, "/pause")
	writeProc(t, root, 2, "kthreadd", 'S', 0) // kernel thread: empty cmdline
	// nginx rewrites argv into one string; workers keep comm "nginx".
	writeProc(t, root, 10, "nginx", 'S', 1, "nginx: master process /usr/sbin/nginx -p /etc/nginx/ -c conf/nginx.conf")
	writeProc(t, root, 11, "nginx", 'S', 10, "nginx: worker process")
	writeProc(t, root, 12, "nginx", 'S', 10, "nginx: worker process is shutting down")
	writeProc(t, root, 13, "nginx", 'Z', 10) // zombie worker
	// The sidecar itself.
	writeProc(t, root, 20, "reload", 'S', 1, "/reload", "--process", "nginx: master", "--watch", "/conf")
	// CART, with a comm longer than 15 characters truncated by the kernel
	// and parentheses that must not confuse the stat parser.
	writeProc(t, root, 30, "cache-aware-rou", 'S', 1, "/usr/local/bin/cache-aware-router", "--config", "/configs/config.yaml")
	writeProc(t, root, 40, "weird) (name", 'S', 1, "python3", "-m", "cache-aware-router")
	return root
}

func TestFindTarget(t *testing.T) {
	procs, err := ListProcesses(procFixture(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		match   string
		want    int
		wantErr error
	}{
		{"nginx: master", 10, nil},                                        // argv[0] prefix
		{"nginx: master process /usr/sbin/nginx -p /etc/nginx/", 10, nil}, // a longer prefix
		{"nginx", 10, nil},                                                // workers (children of a match) dropped
		{"cache-aware-router", 30, nil},                                   // basename equal
		{"/usr/local/bin/cache-aware-router", 30, nil},                    // equal
		{"cache-aware-rou", 0, ErrNoProcess},                              // the truncated comm is not argv[0]
		{"/reload", 0, ErrNoProcess},                                      // never itself
		{"--process", 0, ErrNoProcess},                                    // arguments are not compared
		{"nginx: worker", 0, ErrAmbiguousProcess},                         // two workers, parent does not match
		{"pause", 1, nil},
		{"kthreadd", 0, ErrNoProcess}, // comm is never compared
		{"", 0, ErrNoProcess},
	} {
		t.Run(tc.match, func(t *testing.T) {
			p, err := FindTarget(procs, tc.match, 20)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got %v, %v; want error %v", p, err, tc.wantErr)
				}
				return
			}
			if err != nil || p.PID != tc.want {
				t.Fatalf("got %v, %v; want pid %d", p, err, tc.want)
			}
		})
	}
}

func TestFindTargetTwoMasters(t *testing.T) {
	root := procFixture(t)
	writeProc(t, root, 50, "nginx", 'S', 1, "nginx: master process nginx -p /other/")
	procs, err := ListProcesses(root)
	if err != nil {
		t.Fatal(err)
	}
	_, err = FindTarget(procs, "nginx: master", 20)
	if !errors.Is(err, ErrAmbiguousProcess) || !strings.Contains(err.Error(), "50") || !strings.Contains(err.Error(), "10") {
		t.Fatalf("got %v, want ambiguous naming pids 10 and 50", err)
	}
}

func TestChildren(t *testing.T) {
	root := procFixture(t)
	if got := Children(root, 10); len(got) != 2 || got[0] != 11 || got[1] != 12 {
		t.Fatalf("children of 10: got %v, want [11 12] (zombie 13 left out)", got)
	}
	if got := Children(root, 30); len(got) != 0 {
		t.Fatalf("children of 30: got %v, want none", got)
	}
}

func TestListProcessesRealProc(t *testing.T) {
	procs, err := ListProcesses("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if p.PID == os.Getpid() {
			if p.Argv0 != os.Args[0] || p.PPID != os.Getppid() {
				t.Fatalf("self: got %+v, want argv0 %q ppid %d", p, os.Args[0], os.Getppid())
			}
			// Another copy of this binary may run; itself never matches.
			if q, err := FindTarget(procs, os.Args[0], os.Getpid()); err == nil && q.PID == os.Getpid() {
				t.Fatalf("the test binary matched itself: %+v", q)
			}
			return
		}
	}
	t.Fatal("own pid not found in /proc")
}
