package endpoints

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
		got := Normalize(in)
		want := reference(t, in)
		if len(got) != len(want) {
			t.Fatalf("round %d: %d endpoints, want %d", round, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i].Endpoint {
				t.Fatalf("round %d, #%d: got %+v, want %+v", round, i, got[i], want[i].Endpoint)
			}
		}
	}
}

type refEndpoint struct {
	Endpoint
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
		all = append(all, refEndpoint{Endpoint{IP: a.String(), GPUProduct: e.GPUProduct, Port: e.Port}, a})
	}
	slices.SortStableFunc(all, func(a, b refEndpoint) int {
		if c := a.addr.Compare(b.addr); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Port, b.Port); c != 0 {
			return c
		}
		return strings.Compare(a.GPUProduct, b.GPUProduct)
	})
	return slices.CompactFunc(all, func(a, b refEndpoint) bool { return a.addr == b.addr && a.Port == b.Port })
}

// TestNormalizeDuplicates pins which duplicate is kept, in any input order:
// smallest GPU label, then Ready, then a set node; an empty node is filled.
// Unrenderable entries stay, last, for the compiler to reject.
func TestNormalizeDuplicates(t *testing.T) {
	in := []Endpoint{
		{IP: "10.0.0.9", Port: 80, Node: "n9"},
		{IP: "10.0.0.9", Port: 80, Ready: true},
		{IP: "::ffff:10.0.0.1", Port: 80, GPUProduct: "B", Ready: true, Node: "b"},
		{IP: "10.0.0.1", Port: 80, GPUProduct: "A"},
		{IP: "fd00::1", Port: 80, Ready: true},
		{IP: "fd00:0::1", Port: 80, Node: "n6"},
		{IP: "bad", Port: 80},
		{IP: "10.0.0.2", Port: 0},
	}
	want := []Endpoint{
		{IP: "10.0.0.1", Port: 80, GPUProduct: "A", Node: "b"},
		{IP: "10.0.0.9", Port: 80, Ready: true, Node: "n9"},
		{IP: "fd00::1", Port: 80, Ready: true, Node: "n6"},
		{IP: "10.0.0.2", Port: 0},
		{IP: "bad", Port: 80},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		rng.Shuffle(len(in), func(i, j int) { in[i], in[j] = in[j], in[i] })
		if got := Normalize(in); !slices.Equal(got, want) {
			t.Fatalf("Normalize(%+v)\n got %+v\nwant %+v", in, got, want)
		}
	}
	if Normalize(nil) != nil {
		t.Error("Normalize(nil) != nil")
	}
}

// BenchmarkNormalize measures the sort and dedup Compile no longer does
// (discovery does it once per snapshot): n endpoints in reverse order, one
// in ten IPv6.
func BenchmarkNormalize(b *testing.B) {
	for _, n := range []int{100, 10000} {
		in := make([]Endpoint, 0, n)
		for i := n - 1; i >= 0; i-- {
			ip := fmt.Sprintf("10.%d.%d.%d", 1+i/65536, i/256%256, i%256)
			if i%10 == 9 {
				ip = fmt.Sprintf("fd00::%x", i)
			}
			in = append(in, Endpoint{IP: ip, Port: 8000, Ready: true})
		}
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Normalize(in)
			}
		})
	}
}
