// Package readiness reports whether required local TCP listeners exist in
// the current network namespace, by reading <proc-root>/net/tcp and
// <proc-root>/net/tcp6 in pure Go.
//
// It backs the readyz sidecar (GET /readyz) and hagate's "should be active"
// check. The contract, in short:
//
//   - A port counts only when a row's local port matches and its state is
//     0A (LISTEN). Connections to or from the port do not count.
//   - Fail open: when a table cannot be read, or its header or rows are not
//     in the expected format, the result is Ready and Enforced is false.
//     A missing tcp6 (kernel booted with ipv6.disable=1) is an empty table,
//     not a failure. Fail-open covers unreadable tables only: a port that
//     never listens is reported missing on every check.
//   - Three states, each logged once per transition (see State).
//   - Bounded cost: a result is cached for the TTL, and callers that arrive
//     while a scan runs wait for it instead of starting another.
package readiness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// DefaultTTL is how long a check result is reused when Options.TTL is 0.
	DefaultTTL = time.Second
	// DefaultProcRoot is used when Options.ProcRoot is empty.
	DefaultProcRoot = "/proc"
	// MaxPorts bounds the number of required ports (the CRD uses the same
	// bound), which also lets a scan track them in a uint32 bitmask.
	MaxPorts = 16
)

// Log messages, exported so callers and tests match them without copying
// strings.
const (
	MsgPresent         = "required listeners present; reporting ready"
	MsgMissing         = "required listeners missing; reporting not ready"
	MsgNotEnforced     = "required listeners not enforced; reporting ready"
	MsgTableUnreadable = "cannot read TCP socket table"
	MsgTableRecovered  = "TCP socket table readable again"
)

// State is the outcome of one check.
type State int

const (
	// StateNotRequired: no ports are required; always ready, nothing is
	// read and nothing is logged.
	StateNotRequired State = iota
	// StatePresent: every table was read and every required port has a
	// LISTEN socket.
	StatePresent
	// StateMissing: every table was read and at least one required port
	// has no LISTEN socket. The only state that is not ready.
	StateMissing
	// StateNotEnforced: at least one table could not be read, so the check
	// fails open and reports ready, even if every port happened to be seen
	// in the readable tables ("present" is reserved for a complete read).
	StateNotEnforced
)

func (s State) String() string {
	switch s {
	case StateNotRequired:
		return "not required"
	case StatePresent:
		return "present"
	case StateMissing:
		return "missing"
	case StateNotEnforced:
		return "not enforced"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Result is the answer of one check. Results are shared between callers
// through the cache, so Check hands out copies of the slices.
type Result struct {
	// Ready is false only in StateMissing.
	Ready bool
	// State is the logged state this result belongs to.
	State State
	// Enforced is true when every table was read, so Ready reflects the
	// sockets rather than failing open.
	Enforced bool
	// Missing lists the required ports with no LISTEN socket in the tables
	// that were read, in the configured order. When Enforced is false they
	// are unverified rather than missing, and Ready stays true.
	Missing []int
	// Unreadable lists the paths of the tables that could not be read.
	Unreadable []string
	// CheckedAt is when the scan behind this result finished.
	CheckedAt time.Time
	// Err is non-nil only when ctx ended while waiting for a scan another
	// caller started; the other fields are then zero.
	Err error
}

func (r Result) clone() Result {
	r.Missing = slices.Clone(r.Missing)
	r.Unreadable = slices.Clone(r.Unreadable)
	return r
}

// Clock is the time source; tests inject a fake one.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Options configures a Detector. The zero value of every field except
// Ports has a default.
type Options struct {
	// ProcRoot is the procfs mount to read, DefaultProcRoot when empty.
	// Tests and users point it at fixtures.
	ProcRoot string
	// Ports are the required listeners: 1–65535, unique, at most MaxPorts.
	// None means always ready.
	Ports []int
	// TTL is how long a result is reused; DefaultTTL when 0.
	TTL time.Duration
	// Clock defaults to the wall clock.
	Clock Clock
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// ValidatePorts checks the Ports bounds; callers use it to reject flags
// before building a Detector.
func ValidatePorts(ports []int) error {
	if len(ports) > MaxPorts {
		return fmt.Errorf("at most %d required listeners, got %d", MaxPorts, len(ports))
	}
	seen := make(map[int]bool, len(ports))
	for _, p := range ports {
		if p < 1 || p > 65535 {
			return fmt.Errorf("required listener port %d out of range 1-65535", p)
		}
		if seen[p] {
			return fmt.Errorf("required listener port %d listed twice", p)
		}
		seen[p] = true
	}
	return nil
}

// Detector checks for required listeners. It is safe for concurrent use.
type Detector struct {
	ports  []int
	want   map[uint16]uint32 // port -> bit, built once
	all    uint32            // every bit in want
	tables []table
	ttl    time.Duration
	clock  Clock
	log    *slog.Logger
	scans  atomic.Uint64
	// waiting counts callers blocked on another caller's scan; tests use
	// it to know every caller has joined before letting a scan finish.
	waiting atomic.Int64

	// scan is replaced by tests to count or break scans.
	scan func() scanResult

	// mu guards only the fields below: the cached result, the in-flight
	// marker and the logging state. Scans never run under it.
	mu         sync.Mutex
	cached     Result
	expires    time.Time
	haveCached bool
	inflight   *flight
	loggedKey  string
	tableDown  map[string]bool
}

// flight is one scan in progress. Waiters block on done; ok is false when
// the scan panicked, in which case they try again.
type flight struct {
	done chan struct{}
	res  Result
	ok   bool
}

// NewDetector validates opts and returns a Detector. It does not read
// anything until the first Check.
func NewDetector(opts Options) (*Detector, error) {
	if err := ValidatePorts(opts.Ports); err != nil {
		return nil, err
	}
	if opts.TTL < 0 {
		return nil, fmt.Errorf("cache ttl %v is negative", opts.TTL)
	}
	d := &Detector{
		ports:     slices.Clone(opts.Ports),
		want:      make(map[uint16]uint32, len(opts.Ports)),
		ttl:       opts.TTL,
		clock:     opts.Clock,
		log:       opts.Logger,
		tableDown: map[string]bool{},
	}
	if d.ttl == 0 {
		d.ttl = DefaultTTL
	}
	if d.clock == nil {
		d.clock = realClock{}
	}
	if d.log == nil {
		d.log = slog.Default()
	}
	root := opts.ProcRoot
	if root == "" {
		root = DefaultProcRoot
	}
	for i, p := range d.ports {
		bit := uint32(1) << i
		d.want[uint16(p)] = bit
		d.all |= bit
	}
	d.tables = []table{
		{path: root + "/net/tcp"},
		// A missing tcp6 is what a kernel booted with ipv6.disable=1
		// looks like: no IPv6 sockets at all, not an unreadable table.
		{path: root + "/net/tcp6", absentIsEmpty: true},
	}
	d.scan = d.scanTables
	return d, nil
}

// Ports returns the required ports in the configured order.
func (d *Detector) Ports() []int { return slices.Clone(d.ports) }

// Scans returns how many scans have completed, for metrics and tests.
func (d *Detector) Scans() uint64 { return d.scans.Load() }

// Check returns the current result: the cached one while it is younger
// than the TTL, else the result of a scan, shared with every caller that
// arrives while it runs. Only waiting honours ctx; a scan that has started
// runs to the end (reading two procfs files takes milliseconds).
func (d *Detector) Check(ctx context.Context) Result {
	if len(d.ports) == 0 {
		return Result{Ready: true, State: StateNotRequired, Enforced: true, CheckedAt: d.clock.Now()}
	}
	for {
		d.mu.Lock()
		if d.haveCached && d.clock.Now().Before(d.expires) {
			r := d.cached
			d.mu.Unlock()
			return r.clone()
		}
		if f := d.inflight; f != nil {
			d.mu.Unlock()
			d.waiting.Add(1)
			select {
			case <-f.done:
				d.waiting.Add(-1)
				if f.ok {
					return f.res.clone()
				}
				// The scan panicked: start or join a new one.
				continue
			case <-ctx.Done():
				d.waiting.Add(-1)
				return Result{Err: ctx.Err()}
			}
		}
		f := &flight{done: make(chan struct{})}
		d.inflight = f
		d.mu.Unlock()
		return d.lead(f).clone()
	}
}

// lead runs the scan for f. The deferred cleanup runs even if the scan
// panics, so the in-flight marker never stays set and later callers are
// never wedged; the panic itself goes on to the caller (net/http recovers
// it per request).
func (d *Detector) lead(f *flight) Result {
	defer func() {
		d.mu.Lock()
		if d.inflight == f {
			d.inflight = nil
		}
		d.mu.Unlock()
		close(f.done)
	}()
	sr := d.scan()
	d.scans.Add(1)
	now := d.clock.Now()

	d.mu.Lock()
	res, logs := d.record(sr, now)
	d.mu.Unlock()

	// Log outside the mutex. Scans are serialised by the in-flight marker,
	// which is still held here, so transitions are logged in order.
	for _, l := range logs {
		d.log.Log(context.Background(), l.level, l.msg, l.attrs...)
	}
	f.res, f.ok = res, true
	return res
}

type logLine struct {
	level slog.Level
	msg   string
	attrs []any
}

// record turns a scan into a Result, caches it and works out which
// transitions to log. Called with mu held.
func (d *Detector) record(sr scanResult, now time.Time) (Result, []logLine) {
	var logs []logLine
	var unreadable []string
	for _, t := range d.tables {
		err := sr.errs[t.path]
		switch {
		case err != nil && !d.tableDown[t.path]:
			d.tableDown[t.path] = true
			logs = append(logs, logLine{slog.LevelWarn, MsgTableUnreadable, []any{"table", t.path, "error", err.Error()}})
		case err == nil && d.tableDown[t.path]:
			d.tableDown[t.path] = false
			logs = append(logs, logLine{slog.LevelInfo, MsgTableRecovered, []any{"table", t.path}})
		}
		if err != nil {
			unreadable = append(unreadable, t.path)
		}
	}
	var missing []int
	for i, p := range d.ports {
		if sr.found&(1<<i) == 0 {
			missing = append(missing, p)
		}
	}
	res := Result{Missing: missing, Unreadable: unreadable, CheckedAt: now}
	switch {
	case len(unreadable) > 0:
		res.State, res.Ready, res.Enforced = StateNotEnforced, true, false
	case len(missing) > 0:
		res.State, res.Ready, res.Enforced = StateMissing, false, true
	default:
		res.State, res.Ready, res.Enforced = StatePresent, true, true
	}

	// The key includes the details, so a different set of missing ports or
	// unreadable tables is a new transition worth one more line.
	key := fmt.Sprint(res.State, missing, unreadable)
	if key != d.loggedKey {
		d.loggedKey = key
		switch res.State {
		case StatePresent:
			logs = append(logs, logLine{slog.LevelInfo, MsgPresent, []any{"ports", d.ports}})
		case StateMissing:
			logs = append(logs, logLine{slog.LevelWarn, MsgMissing, []any{"ports", d.ports, "missing", missing}})
		case StateNotEnforced:
			logs = append(logs, logLine{slog.LevelWarn, MsgNotEnforced, []any{"ports", d.ports, "unseen", missing, "unreadable", unreadable}})
		}
	}

	d.cached, d.haveCached, d.expires = res, true, now.Add(d.ttl)
	return res, logs
}

// scanResult is what one pass over the tables saw.
type scanResult struct {
	found uint32           // bits of d.want seen as LISTEN in readable tables
	errs  map[string]error // table path -> why it was unreadable
}

// scanTables reads every table. A table that fails contributes nothing to
// found, even for rows read before the failure, so a half-read table never
// counts as evidence either way.
func (d *Detector) scanTables() scanResult {
	sr := scanResult{errs: map[string]error{}}
	for _, t := range d.tables {
		// Ports already seen need not be looked for again; the table is
		// still opened and its header checked so that a broken table is
		// noticed (and logged) whatever order things are found in.
		found, err := t.scan(d.want, d.all&^sr.found)
		if err != nil {
			sr.errs[t.path] = err
			continue
		}
		sr.found |= found
	}
	return sr
}

// errNotRegular is returned for a table path that is not a regular file
// (a directory, a fifo), which real procfs tables always are.
var errNotRegular = errors.New("not a regular file")
