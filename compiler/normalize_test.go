package compiler

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// TestNormalizeMatchesReference checks the packed IPv4 fast path and the
// general path together against a plain reference: order by address
// (IPv4 before IPv6), then port; one endpoint per address and port, the
// smallest GPU label winning.
func TestNormalizeMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	gpus := []string{"", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"}
	for round := range 201 {
		n := rng.IntN(300)
		if round == 200 {
			n = 1<<16 + 500 // more than the packed path's index holds: all go the general way
		}
		in := make([]Endpoint, n)
		for i := range in {
			ip := fmt.Sprintf("10.%d.%d.%d", rng.IntN(3), rng.IntN(4), rng.IntN(256))
			switch rng.IntN(5) {
			case 0:
				ip = fmt.Sprintf("fd00::%x", rng.IntN(64))
			case 1:
				ip = fmt.Sprintf("::ffff:10.0.0.%d", rng.IntN(8))
			}
			in[i] = Endpoint{IP: ip, Port: int32(8000 + rng.IntN(3)), GPUProduct: gpus[rng.IntN(len(gpus))]}
		}
		got, err := normalize(in, "backend")
		if err != nil {
			t.Fatal(err)
		}
		want := reference(t, in)
		if len(got) != len(want) {
			t.Fatalf("round %d: %d endpoints, want %d", round, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i].endpoint {
				t.Fatalf("round %d, #%d: got %+v, want %+v", round, i, got[i], want[i].endpoint)
			}
		}
	}
}

type refEndpoint struct {
	endpoint
	addr netip.Addr
}

func reference(t *testing.T, in []Endpoint) []refEndpoint {
	t.Helper()
	var all []refEndpoint
	for _, e := range in {
		a, err := netip.ParseAddr(e.IP)
		if err != nil {
			t.Fatal(err)
		}
		a = a.Unmap()
		all = append(all, refEndpoint{endpoint{ip: a.String(), gpu: e.GPUProduct, port: e.Port, v6: a.Is6()}, a})
	}
	slices.SortStableFunc(all, func(a, b refEndpoint) int {
		if c := a.addr.Compare(b.addr); c != 0 {
			return c
		}
		if c := cmp.Compare(a.port, b.port); c != 0 {
			return c
		}
		return strings.Compare(a.gpu, b.gpu)
	})
	return slices.CompactFunc(all, func(a, b refEndpoint) bool { return a.addr == b.addr && a.port == b.port })
}
