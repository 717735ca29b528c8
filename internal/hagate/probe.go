// TCP and listener probes: whether this pod is healthy enough to contend
// for the Lease (its app port accepts connections and its required
// listeners are present).

package hagate

import (
	"context"
	"fmt"
	"net"
	"time"
)

// ListenerGate reports whether the required local listeners are present
// and, if not, which ports are missing.
type ListenerGate interface {
	Present(ctx context.Context) (bool, []int)
}

// AppProbe reports whether the local app accepts connections.
type AppProbe interface {
	Probe(ctx context.Context) error
}

// TCPProbe is an AppProbe that opens (and closes) a TCP connection.
type TCPProbe struct {
	Addr    string
	Timeout time.Duration
}

var _ AppProbe = TCPProbe{}

// Probe dials Addr within Timeout.
func (p TCPProbe) Probe(ctx context.Context) error {
	d := net.Dialer{Timeout: p.Timeout}
	c, err := d.DialContext(ctx, "tcp", p.Addr)
	if err != nil {
		return err
	}
	return c.Close()
}

func (g *Gate) health(ctx context.Context) (bool, string) {
	if err := g.cfg.App.Probe(ctx); err != nil {
		return false, "app port not accepting connections: " + err.Error()
	}
	if g.cfg.Listeners != nil {
		if ok, missing := g.cfg.Listeners.Present(ctx); !ok {
			return false, fmt.Sprintf("required listeners missing: %v", missing)
		}
	}
	return true, ""
}
