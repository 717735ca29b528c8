package reload

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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

// ListProcesses reads every <procRoot>/<pid>/cmdline and stat. Processes
// that vanish while being read, and kernel threads and zombies (empty
// cmdline), are left out.
func ListProcesses(procRoot string) ([]Process, error) {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", procRoot, err)
	}
	var procs []Process
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue
		}
		ppid, _, err := readStat(procRoot, pid)
		if err != nil {
			continue
		}
		argv0, _, _ := bytes.Cut(cmdline, []byte{0})
		procs = append(procs, Process{PID: pid, PPID: ppid, Argv0: string(argv0)})
	}
	return procs, nil
}

// readStat returns the parent pid and the state letter of a process. The
// fields are read after the last ')' because comm may contain spaces and
// parentheses.
func readStat(procRoot string, pid int) (ppid int, state byte, err error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("malformed %s/%d/stat", procRoot, pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("malformed %s/%d/stat", procRoot, pid)
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil {
		return 0, 0, fmt.Errorf("malformed %s/%d/stat: %w", procRoot, pid, err)
	}
	return ppid, f[0][0], nil
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

// Children returns the live (non-zombie) children of pid, sorted.
func Children(procRoot string, pid int) []int {
	ents, _ := os.ReadDir(procRoot)
	var kids []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, state, err := readStat(procRoot, p)
		if err == nil && ppid == pid && state != 'Z' && state != 'X' {
			kids = append(kids, p)
		}
	}
	slices.Sort(kids)
	return kids
}
