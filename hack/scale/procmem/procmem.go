// Package procmem reads a process's memory from /proc, for the scale
// benchmark and its floor program alike.
package procmem

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Read reads VmRSS and VmHWM (KiB) of a process.
func Read(pid int) (rss, hwm int64, err error) {
	v, err := status(pid, "VmRSS", "VmHWM")
	return v[0], v[1], err
}

// Split reads RssAnon and RssFile (KiB) of a process: the memory it
// allocated (heap, stacks, runtime) and the mapped file pages it touched
// (mostly its binary's code and read-only data, which the kernel can drop
// and read again).
func Split(pid int) (anon, file int64, err error) {
	v, err := status(pid, "RssAnon", "RssFile")
	return v[0], v[1], err
}

// status reads the KiB values of keys from /proc/<pid>/status; each must
// be there.
func status(pid int, keys ...string) ([]int64, error) {
	out := make([]int64, len(keys))
	found := make([]bool, len(keys))
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return out, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		for i, want := range keys {
			f := strings.Fields(v)
			if k != want || len(f) == 0 {
				continue
			}
			if out[i], err = strconv.ParseInt(f[0], 10, 64); err != nil {
				return out, fmt.Errorf("/proc/%d/status %s: %w", pid, k, err)
			}
			found[i] = true
		}
	}
	for i, k := range keys {
		if !found[i] {
			return out, fmt.Errorf("/proc/%d/status: no %s", pid, k)
		}
	}
	return out, nil
}
