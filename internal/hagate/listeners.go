package hagate

import (
	"context"

	"github.com/modelsphere/autoconfig/internal/readiness"
)

// DetectorGate adapts the readiness detector (the same /proc/net/tcp
// reader behind readyz) to ListenerGate. It inherits the detector's
// fail-open rule: unreadable socket tables count as present.
type DetectorGate struct {
	D *readiness.Detector
}

var _ ListenerGate = DetectorGate{}

// Present reports whether every required listener has a LISTEN socket.
func (g DetectorGate) Present(ctx context.Context) (bool, []int) {
	r := g.D.Check(ctx)
	if r.Err != nil {
		// ctx ended while another caller's scan ran: not proven present.
		return false, nil
	}
	return r.Ready, r.Missing
}
