package reload

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// checker runs --check-cmd, before a signal (signal.go) and, in API mode,
// on each candidate content of the quarantine search (apply.go).
type checker struct {
	cmd     []string      // --check-cmd split, nil = no check
	timeout time.Duration // --check-timeout
	passed  string        // fingerprint of a content that passed the check
}

// enabled reports whether there is a check command.
func (c *checker) enabled() bool { return len(c.cmd) > 0 }

// maxCheckOutput bounds the check command's output kept in the log.
const maxCheckOutput = 8 << 10

// run runs the check command once; its error carries the output.
func (c *checker) run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.cmd[0], c.cmd[1:]...).CombinedOutput()
	if err == nil {
		return nil
	}
	if len(out) > maxCheckOutput {
		out = append(out[:maxCheckOutput], "…"...)
	}
	return fmt.Errorf("%q: %w: %s", c.cmd, err, out)
}

// failingKeys are the visible files of dirs that a check's output names
// (nginx: "… in /etc/nginx/routes/<key>:3"), so a refused change in a
// read-only mount still says which key to fix.
func failingKeys(out string, dirs []string) []string {
	var keys []string
	for _, d := range dirs {
		files, err := readFiles(d)
		if err != nil {
			continue
		}
		for k := range files {
			if mentions(out, k) {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// mentions reports whether out names file as a whole path element.
func mentions(out, name string) bool {
	for i := 0; ; {
		j := strings.Index(out[i:], name)
		if j < 0 {
			return false
		}
		j += i
		before := j == 0 || strings.ContainsRune("/ \t\"'(", rune(out[j-1]))
		end := j + len(name)
		after := end == len(out) || !isNameByte(out[end])
		if before && after {
			return true
		}
		i = j + 1
	}
}

func isNameByte(c byte) bool {
	return c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
