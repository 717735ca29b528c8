package reload

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// listenUnixRE finds the socket a route file's server listens on; route
// files carry exactly one "listen unix:<sockdir>/<route>.sock;" line.
var listenUnixRE = regexp.MustCompile(`(?m)^[ \t]*listen[ \t]+unix:([^\s;]+)`)

// ReferencedSockets returns the file names ("<route>.sock") of the sockets
// the visible *.conf files of dirs listen on. Names, not paths: the sidecar
// may mount the socket directory at another path than nginx does.
func ReferencedSockets(dirs []string) (map[string]bool, error) {
	refs := map[string]bool{}
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".") || !strings.HasSuffix(e.Name(), ".conf") {
				continue
			}
			b, err := os.ReadFile(filepath.Join(d, e.Name()))
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				return nil, err
			}
			for _, m := range listenUnixRE.FindAllSubmatch(b, -1) {
				refs[filepath.Base(string(m[1]))] = true
			}
		}
	}
	return refs, nil
}

// SocketState is what a connect() to a socket file says about it.
type SocketState int

const (
	// SocketUnknown: connect failed for another reason (permission, a
	// full backlog timing out, …); such a file is left alone.
	SocketUnknown SocketState = iota
	// SocketLive: something accepts connections on it.
	SocketLive
	// SocketStale: connect() is refused, nothing listens on that inode.
	SocketStale
)

// probeTimeout bounds one connect() to a socket. A live nginx accepts at
// once; a full backlog blocks until this and counts as unknown (kept).
const probeTimeout = 500 * time.Millisecond

// staleRecheck is the pause before the second connect() that confirms a
// refusal: a server between bind() and listen() refuses for an instant, and
// a live socket must never be unlinked.
const staleRecheck = 50 * time.Millisecond

// ProbeSocket connects to path; it reports SocketStale only when connect()
// is refused twice.
func ProbeSocket(path string) SocketState {
	for i := 0; ; i++ {
		c, err := net.DialTimeout("unix", path, probeTimeout)
		if err == nil {
			c.Close()
			return SocketLive
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return SocketUnknown
		}
		if i == 1 {
			return SocketStale
		}
		time.Sleep(staleRecheck)
	}
}

// SocketAction is what CleanSockets did or decided about one socket file.
type SocketAction struct {
	Path       string
	Referenced bool
	State      SocketState
	Removed    bool
	Err        error
}

// CleanSockets removes stale "*.sock" files of sockDir: those connect()
// refuses, whether or not a route still references them (a crashed master
// leaves referenced sockets behind too, and nginx then fails to bind
// them). A socket that accepts a connection is never removed, referenced
// or not: on a graceful reload nginx unlinks the sockets of removed
// servers itself, and unlinking a live socket would leave its route
// unreachable until it is removed and re-added.
func CleanSockets(sockDir string, referenced map[string]bool) ([]SocketAction, error) {
	ents, err := os.ReadDir(sockDir)
	if err != nil {
		return nil, err
	}
	var acts []SocketAction
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".sock") || e.Type()&fs.ModeSocket == 0 {
			continue
		}
		p := filepath.Join(sockDir, e.Name())
		a := SocketAction{Path: p, Referenced: referenced[e.Name()], State: ProbeSocket(p)}
		if a.State == SocketStale {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				a.Err = err
			} else {
				a.Removed = true
			}
		}
		acts = append(acts, a)
	}
	return acts, nil
}
