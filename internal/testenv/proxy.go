package testenv

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Modes of a TCPProxy.
const (
	// ProxyForward forwards every connection to the target.
	ProxyForward = "forward"
	// ProxyRefuse accepts and resets every connection (a reset, not an
	// orderly close): the API server is away.
	ProxyRefuse = "refuse"
	// ProxyBlackhole accepts connections and never answers: a partition.
	ProxyBlackhole = "blackhole"
)

// TCPProxy stands between a client and the API server (or any TCP
// target) and forwards, refuses or black-holes its connections; changing
// the mode cuts every open connection. Tests cut a controller off from the
// API server with it.
type TCPProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	mode  string
	conns map[net.Conn]bool
}

// NewTCPProxy listens on a free local port and serves connections in
// mode until the test ends.
func NewTCPProxy(t testing.TB, target, mode string) *TCPProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &TCPProxy{ln: ln, target: target, mode: mode, conns: map[net.Conn]bool{}}
	t.Cleanup(func() {
		ln.Close()
		p.SetMode(ProxyRefuse)
	})
	go p.serve()
	return p
}

// Addr is the proxy's host:port.
func (p *TCPProxy) Addr() string { return p.ln.Addr().String() }

// SetMode switches the mode and closes every open connection.
func (p *TCPProxy) SetMode(mode string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = mode
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

func (p *TCPProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		mode := p.mode
		switch mode {
		case ProxyRefuse:
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // a reset, not an orderly close
			}
			c.Close()
		case ProxyBlackhole, ProxyForward:
			p.conns[c] = true
		}
		p.mu.Unlock()
		if mode == ProxyForward {
			go p.forward(c)
		}
	}
}

func (p *TCPProxy) forward(c net.Conn) {
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if !p.conns[c] { // cut meanwhile
		p.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	p.conns[up] = true
	p.mu.Unlock()
	go func() { _, _ = io.Copy(up, c); up.Close() }()
	_, _ = io.Copy(c, up)
	c.Close()
}
