// Package endpoints holds the discovered Endpoint and its one normal form:
// sorted (IPv4 before IPv6, by address bytes, then port) and unique by
// address and port. Discovery normalises every list it builds (Normalize);
// the compiler only checks the order (Compare) and renders. The package
// imports neither Kubernetes nor the compiler, so both, and the compiler's
// tests, can use it.
package endpoints

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
)

// Endpoint is one discovered endpoint (compiler.Endpoint is an alias).
type Endpoint struct {
	// IP is an IPv4 or IPv6 address (IPv6 without brackets).
	IP string `json:"ip"`
	// Port is the endpoint's port.
	Port int32 `json:"port"`
	// Ready is the endpoint's readiness as discovered; discovery already
	// applied includeNotReady, so the compiler renders every endpoint given.
	Ready bool `json:"ready"`
	// Node is the node name, if known.
	Node string `json:"node,omitempty"`
	// GPUProduct is the node's nvidia.com/gpu.product label, if any.
	GPUProduct string `json:"gpuProduct,omitempty"`
}

// Compare is the normal order of endpoints: by address (IPv4-mapped IPv6
// unmapped; IPv4 before IPv6, as netip.Addr.Compare orders them), then by
// port. Zero means the same endpoint.
func Compare(a netip.Addr, aPort int32, b netip.Addr, bPort int32) int {
	if c := a.Compare(b); c != 0 {
		return c
	}
	return cmp.Compare(aPort, bPort)
}

// Normalize returns eps in normal order (Compare) with one endpoint per
// address and port and every IP in canonical text (IPv4-mapped IPv6
// unmapped). Of duplicates, the one kept is the first by: smallest GPU label,
// Ready before not ready, Node set before unset, smallest Node; when its Node
// is empty it takes the smallest Node of the duplicates. The result depends
// neither on list nor on slice order, so a resync renders the same bytes.
// eps is not modified.
//
// Entries that cannot be rendered (unparseable IP, IP with a zone, port
// outside 1-65535) are kept, after the others, ordered by text and port and
// not deduplicated: the compiler rejects them with an error naming them.
//
// IPv4 endpoints (the common case) sort as packed uint64s (address, port,
// index) with no comparison closure; the rest (IPv6, or more endpoints than
// the index field holds) sort on pointer-free keys. At 10,000 endpoints
// this is most of the cost of a snapshot.
func Normalize(in []Endpoint) []Endpoint {
	if len(in) == 0 {
		return nil
	}
	pack := len(in) <= 1<<16
	var v4 []uint64
	var keys []sortKey
	var bad []int
	var text map[int]string // canonical text of IPv4 inputs not written canonically (rare)
	if pack {
		v4 = make([]uint64, 0, len(in))
	}
	for i := range in {
		a, err := netip.ParseAddr(in[i].IP)
		if err != nil || a.Zone() != "" || in[i].Port < 1 || in[i].Port > 65535 {
			bad = append(bad, i)
			continue
		}
		// ParseAddr accepts only the canonical dotted form for IPv4 (no
		// leading zeros), so only IPv4-mapped IPv6 needs new text.
		mapped := a.Is4In6()
		a = a.Unmap()
		if mapped {
			if text == nil {
				text = map[int]string{}
			}
			text[i] = a.String()
		}
		if pack && a.Is4() {
			a4 := a.As4()
			v4 = append(v4, uint64(binary.BigEndian.Uint32(a4[:]))<<32|uint64(uint16(in[i].Port))<<16|uint64(i))
			continue
		}
		a16 := a.As16()
		keys = append(keys, sortKey{
			hi:   binary.BigEndian.Uint64(a16[:8]),
			lo:   binary.BigEndian.Uint64(a16[8:]),
			v6:   a.Is6(),
			port: uint16(in[i].Port),
			idx:  uint32(i),
		})
	}
	out := make([]Endpoint, 0, len(in))
	// keep appends the best of the duplicates dups (input indexes).
	keep := func(dups []int, v6 bool, hi, lo uint64) {
		best, node := -1, ""
		for _, k := range dups {
			if best < 0 || better(&in[k], &in[best]) {
				best = k
			}
			if n := in[k].Node; n != "" && (node == "" || n < node) {
				node = n
			}
		}
		e := in[best]
		if e.Node == "" {
			e.Node = node
		}
		switch {
		case v6:
			var a16 [16]byte
			binary.BigEndian.PutUint64(a16[:8], hi)
			binary.BigEndian.PutUint64(a16[8:], lo)
			e.IP = netip.AddrFrom16(a16).String()
		case text != nil:
			if t, ok := text[best]; ok {
				e.IP = t
			}
		}
		out = append(out, e)
	}
	var dups []int
	slices.Sort(v4)
	for i := 0; i < len(v4); {
		j := i + 1
		for j < len(v4) && v4[j]>>16 == v4[i]>>16 {
			j++
		}
		dups = dups[:0]
		for _, v := range v4[i:j] {
			dups = append(dups, int(v&0xffff))
		}
		keep(dups, false, 0, 0)
		i = j
	}
	slices.SortFunc(keys, func(a, b sortKey) int {
		// IPv4 before IPv6, as netip.Addr.Compare orders them.
		if a.v6 != b.v6 {
			if a.v6 {
				return 1
			}
			return -1
		}
		if c := cmp.Compare(a.hi, b.hi); c != 0 {
			return c
		}
		if c := cmp.Compare(a.lo, b.lo); c != 0 {
			return c
		}
		return cmp.Compare(a.port, b.port)
	})
	for i := 0; i < len(keys); {
		j := i + 1
		for j < len(keys) && keys[j].hi == keys[i].hi && keys[j].lo == keys[i].lo && keys[j].v6 == keys[i].v6 && keys[j].port == keys[i].port {
			j++
		}
		dups = dups[:0]
		for _, k := range keys[i:j] {
			dups = append(dups, int(k.idx))
		}
		keep(dups, keys[i].v6, keys[i].hi, keys[i].lo)
		i = j
	}
	slices.SortStableFunc(bad, func(a, b int) int {
		if c := strings.Compare(in[a].IP, in[b].IP); c != 0 {
			return c
		}
		return cmp.Compare(in[a].Port, in[b].Port)
	})
	for _, i := range bad {
		out = append(out, in[i])
	}
	return out
}

// better says whether a is kept over its duplicate b.
func better(a, b *Endpoint) bool {
	if a.GPUProduct != b.GPUProduct {
		return a.GPUProduct < b.GPUProduct
	}
	if a.Ready != b.Ready {
		return a.Ready
	}
	if (a.Node == "") != (b.Node == "") {
		return a.Node != ""
	}
	return a.Node < b.Node
}

// sortKey orders endpoints outside the packed IPv4 path: family, address
// bytes, port.
type sortKey struct {
	hi, lo uint64
	v6     bool
	port   uint16
	idx    uint32
}
