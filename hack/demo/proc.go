package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelsphere/autoconfig/internal/testbin"
)

// proc is a subprocess (or nginx) the demo stops on exit.
type proc struct {
	name string
	// run is the subprocess; nil for nginx.
	run *testbin.Proc
	// stop replaces the default SIGTERM-then-SIGKILL (nginx has its own).
	stop func() error
}

// start runs bin with its output in <tmp>/<name>.log.
func (d *demo) start(name, bin string, args ...string) (*testbin.Proc, error) {
	p, err := testbin.StartProc(name, filepath.Join(d.tmp, name+".log"), bin, args...)
	if err != nil {
		return nil, err
	}
	d.procs = append(d.procs, &proc{name: name, run: p})
	return p, nil
}

// tail is the end of the process's log, for error messages.
func tail(p *testbin.Proc) string {
	return "\n  " + p.Name + " log (" + p.LogPath + "):\n    " + strings.Join(p.LogTail(15, 0), "\n    ")
}

// terminate sends SIGTERM and, if the process has not exited after a
// grace period, SIGKILL.
func (p *proc) terminate() error {
	if p.stop != nil {
		return p.stop()
	}
	return p.run.Terminate(10 * time.Second)
}

// stopProcs stops every subprocess, newest first.
func (d *demo) stopProcs() {
	for i := len(d.procs) - 1; i >= 0; i-- {
		if err := d.procs[i].terminate(); err != nil {
			fmt.Fprintf(d.out, "demo: stop %s: %v\n", d.procs[i].name, err)
		}
	}
	d.procs = nil
}

func (d *demo) procTails() string {
	var b bytes.Buffer
	for _, p := range d.procs {
		if p.run != nil {
			b.WriteString(tail(p.run))
		}
	}
	return b.String()
}
