package readiness

import (
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/internal/testbin"
)

// fixtureRoot is the proc root of one case under <module>/testdata/proc.
func fixtureRoot(name string) string {
	return filepath.Join("..", "..", "testdata", "proc", name)
}

// fakeClock only moves when told to.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// logSink records JSON log lines for assertions.
type logSink struct {
	testbin.SyncBuffer
}

func (s *logSink) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(s, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// records returns every logged line, decoded.
func (s *logSink) records(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// count returns how many lines carry msg.
func (s *logSink) count(t *testing.T, msg string) int {
	t.Helper()
	n := 0
	for _, r := range s.records(t) {
		if r["msg"] == msg {
			n++
		}
	}
	return n
}

// only returns the single line carrying msg, failing unless there is
// exactly one.
func (s *logSink) only(t *testing.T, msg string) map[string]any {
	t.Helper()
	var found []map[string]any
	for _, r := range s.records(t) {
		if r["msg"] == msg {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want exactly one %q log line, got %d; log:\n%s", msg, len(found), s.String())
	}
	return found[0]
}

var stateMsgs = []string{MsgPresent, MsgMissing, MsgNotEnforced}
