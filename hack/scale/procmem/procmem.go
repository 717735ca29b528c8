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
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/status %s: %w", pid, k, err)
		}
		if k == "VmRSS" {
			rss = n
		} else {
			hwm = n
		}
	}
	if rss == 0 || hwm == 0 {
		return 0, 0, fmt.Errorf("/proc/%d/status: no VmRSS/VmHWM", pid)
	}
	return rss, hwm, nil
}

// Split reads RssAnon and RssFile (KiB) of a process: the memory it
// allocated (heap, stacks, runtime) and the mapped file pages it touched
// (mostly its binary's code and read-only data, which the kernel can drop
// and read again).
func Split(pid int) (anon, file int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "RssAnon" && k != "RssFile") {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/status %s: %w", pid, k, err)
		}
		if k == "RssAnon" {
			anon = n
		} else {
			file = n
		}
	}
	if anon == 0 {
		return 0, 0, fmt.Errorf("/proc/%d/status: no RssAnon", pid)
	}
	return anon, file, nil
}
