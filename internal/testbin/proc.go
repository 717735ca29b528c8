package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Proc is a child process whose output goes to a log file: the process
// runner of the hack tools (hack/demo, hack/scale), which start the real
// binaries and stop them when they are done.
type Proc struct {
	Name    string
	LogPath string
	Cmd     *exec.Cmd
	done    chan struct{}
}

// StartProc runs bin with args, its stdout and stderr in logPath (created
// or truncated). name is how errors and Tail speak of it.
func StartProc(name, logPath, bin string, args ...string) (*Proc, error) {
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
	p := &Proc{Name: name, LogPath: logPath, Cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// PID is the process id.
func (p *Proc) PID() int { return p.Cmd.Process.Pid }

// Exited reports whether the process has exited (and been reaped).
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Terminate sends SIGTERM and, if the process has not exited after grace,
// SIGKILL; it returns once the process is gone, with an error when it had
// to be killed.
func (p *Proc) Terminate(grace time.Duration) error {
	if p.Exited() {
		return nil
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
		_ = p.Cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop on SIGTERM within %s; killed", p.Name, grace)
	}
}

// Kill sends SIGKILL (a node lost, an OOM kill: nothing is cleaned up)
// and waits for the process to end.
func (p *Proc) Kill() {
	if p.Exited() {
		return
	}
	_ = p.Cmd.Process.Kill()
	<-p.done
}

// LogTail is the last n lines of the log, each cut at maxLine bytes (0:
// uncut), for error messages.
func (p *Proc) LogTail(n, maxLine int) []string {
	b, _ := os.ReadFile(p.LogPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		if maxLine > 0 && len(l) > maxLine {
			lines[i] = l[:maxLine] + "…"
		}
	}
	return lines
}
