package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// proc is a subprocess (or nginx) the demo stops on exit.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	// stop replaces the default SIGTERM-then-SIGKILL (nginx has its own).
	stop func() error
}

// start runs bin with its output in <tmp>/<name>.log.
func (d *demo) start(name, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(d.tmp, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	d.procs = append(d.procs, p)
	return p, nil
}

func (p *proc) exited() bool {
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// tail is the end of the process's log, for error messages.
func (p *proc) tail() string {
	if p.logPath == "" {
		return ""
	}
	b, _ := os.ReadFile(p.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return "\n  " + p.name + " log (" + p.logPath + "):\n    " + strings.Join(lines, "\n    ")
}

// terminate sends SIGTERM and, if the process has not exited after a
// grace period, SIGKILL.
func (p *proc) terminate() error {
	if p.stop != nil {
		return p.stop()
	}
	if p.exited() {
		return nil
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop on SIGTERM within 10s; killed", p.name)
	}
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
		b.WriteString(p.tail())
	}
	return b.String()
}
