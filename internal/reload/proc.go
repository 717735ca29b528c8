package reload

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/prometheus/procfs"
)

// Process is one entry of /proc as the matcher sees it.
type Process struct {
	PID   int
	PPID  int
	Argv0 string
}

// Errors of FindTarget; callers tell them apart with errors.Is.
var (
	ErrNoProcess        = errors.New("no process matches")
	ErrAmbiguousProcess = errors.New("several processes match")
)

// ListProcesses reads every <procRoot>/<pid>/cmdline and stat (through
// procfs, rooted at procRoot so tests run on fixtures). Processes that
// vanish while being read, and kernel threads and zombies (empty cmdline),
// are left out.
func ListProcesses(procRoot string) ([]Process, error) {
	all, err := allProcs(procRoot)
	if err != nil {
		return nil, err
	}
	var procs []Process
	for _, p := range all {
		if p.PID <= 0 {
			continue
		}
		argv, err := p.CmdLine()
		if err != nil || len(argv) == 0 {
			continue
		}
		st, err := p.Stat()
		if err != nil {
			continue
		}
		procs = append(procs, Process{PID: p.PID, PPID: st.PPID, Argv0: argv[0]})
	}
	return procs, nil
}

// allProcs lists the numeric entries of procRoot.
func allProcs(procRoot string) (procfs.Procs, error) {
	fs, err := procfs.NewFS(procRoot)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", procRoot, err)
	}
	all, err := fs.AllProcs()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", procRoot, err)
	}
	return all, nil
}

// MatchArgv0 reports whether a process whose argv[0] is argv0 is what
// --process match names: equal, same basename ("/usr/bin/cart" for
// "cart"), or argv[0] starting with match (nginx rewrites its argv into
// the single string "nginx: master process nginx -p …").
func MatchArgv0(argv0, match string) bool {
	if match == "" {
		return false
	}
	return argv0 == match || filepath.Base(argv0) == match || strings.HasPrefix(argv0, match)
}

// FindTarget returns the one process matching match. It never returns the
// process self (whose own arguments may contain match; only argv[0] is
// compared anyway), nor a process whose parent also matches (a worker of the matched master: with a
// match of just "nginx", "nginx: worker process" would otherwise match
// too). No match or several matches are errors wrapping ErrNoProcess or
// ErrAmbiguousProcess.
func FindTarget(procs []Process, match string, self int) (Process, error) {
	var cands []Process
	for _, p := range procs {
		if p.PID == self || !MatchArgv0(p.Argv0, match) {
			continue
		}
		cands = append(cands, p)
	}
	var top []Process
	for _, p := range cands {
		if !slices.ContainsFunc(cands, func(q Process) bool { return q.PID == p.PPID }) {
			top = append(top, p)
		}
	}
	switch len(top) {
	case 1:
		return top[0], nil
	case 0:
		return Process{}, fmt.Errorf("%w %q by argv[0]", ErrNoProcess, match)
	default:
		var list []string
		for _, p := range top {
			list = append(list, fmt.Sprintf("%d (%q)", p.PID, p.Argv0))
		}
		return Process{}, fmt.Errorf("%w %q by argv[0]: %s", ErrAmbiguousProcess, match, strings.Join(list, ", "))
	}
}

// shuttingDownTitle is what an nginx worker's process title says once it
// got the master's QUIT after a reload ("nginx: worker process is
// shutting down"); it sets it as it closes its listening sockets, so from
// then on only the new workers accept connections.
const shuttingDownTitle = "shutting down"

// Accepting returns those of pids that are still live children of pid
// and not shutting down (by their process title): after a reload, the
// old workers that may still accept a new connection.
func Accepting(procRoot string, pid int, pids []int) []int {
	fs, err := procfs.NewFS(procRoot)
	if err != nil {
		return nil
	}
	var out []int
	for _, c := range Children(procRoot, pid) {
		if !slices.Contains(pids, c) {
			continue
		}
		p, err := fs.Proc(c)
		if err != nil {
			continue
		}
		argv, err := p.CmdLine()
		if err != nil || strings.Contains(strings.Join(argv, " "), shuttingDownTitle) {
			continue
		}
		out = append(out, c)
	}
	return out
}

// Children returns the live (non-zombie) children of pid, sorted.
func Children(procRoot string, pid int) []int {
	all, _ := allProcs(procRoot)
	var kids []int
	for _, p := range all {
		st, err := p.Stat()
		if err == nil && st.PPID == pid && st.State != "Z" && st.State != "X" {
			kids = append(kids, p.PID)
		}
	}
	slices.Sort(kids)
	return kids
}
