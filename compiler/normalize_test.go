package compiler

import (
	"cmp"
	"fmt"
	"math/rand/v2"
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
	for round := range 200 {
		n := rng.IntN(300)
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
			if got[i].addr != want[i].addr || got[i].port != want[i].port || got[i].gpu != want[i].gpu {
				t.Fatalf("round %d, #%d: got %v:%d %q, want %v:%d %q", round, i,
					got[i].addr, got[i].port, got[i].gpu, want[i].addr, want[i].port, want[i].gpu)
			}
		}
	}
}

func reference(t *testing.T, in []Endpoint) []endpoint {
	t.Helper()
	var all []endpoint
	for _, e := range in {
		p, err := parseEndpoint(e.IP, e.Port, "backend")
		if err != nil {
			t.Fatal(err)
		}
		p.gpu = e.GPUProduct
		all = append(all, p)
	}
	slices.SortStableFunc(all, func(a, b endpoint) int {
		if c := a.addr.Compare(b.addr); c != 0 {
			return c
		}
		if c := cmp.Compare(a.port, b.port); c != 0 {
			return c
		}
		return strings.Compare(a.gpu, b.gpu)
	})
	return slices.CompactFunc(all, func(a, b endpoint) bool { return a.addr == b.addr && a.port == b.port })
}
