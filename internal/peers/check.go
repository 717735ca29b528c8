package peers

// This file: the rules a table must pass before an engine may take it, in
// one place. The reload sidecar applies them before it pushes (a table the
// engine would refuse is reported refused, never pushed), the compiler
// before it writes (Encode), and the reference engine applies the same in
// lua (deploy/openresty/lua/router_table.lua). testdata/corpus holds the
// cases both sides run: <name>.json tables and verdicts.txt ("<name> ok" or
// "<name> refuse", one a line); testdata/serials.txt the serial header's
// cases ("<value> ok|refuse"). TestCorpus keeps the files equal to
// corpusCases.

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// MaxSerial is the greatest push serial: lua numbers hold whole numbers
// exactly up to 2^53.
const MaxSerial = 1 << 53

// Check applies the engine's rules to a decoded table: a known format (2
// exactly when there is a canary), a route and a version, and in every
// tier (the canary's too) a use, no negative max_concurrency and peers
// whose host is an IP literal (CheckHost) and port 1–65535; a canary's
// weight is 0–100, its header names are ones nginx exposes as
// $http_<name> (CheckHeaderName) and its cookie name an RFC 6265 token
// (CheckCookieName). A name is never empty: the engine applies the split
// as written, and would not silently replace one by its default. It does
// not recompute the version (Parse does; an engine compares versions,
// never recomputes them).
func Check(t Table) error {
	switch {
	case t.Format == Format && t.Canary != nil:
		return errors.New("peers table: format 1 has no canary (a table with one is format 2)")
	case t.Format == FormatCanary && t.Canary == nil:
		return errors.New("peers table: format 2 without a canary")
	case t.Format != Format && t.Format != FormatCanary:
		return fmt.Errorf("peers table: format %d is neither %d nor %d, the ones this release reads", t.Format, Format, FormatCanary)
	}
	if t.Route == "" {
		return errors.New("peers table: no route")
	}
	if t.Version == "" {
		return fmt.Errorf("peers table %s: no version", t.Route)
	}
	if err := checkTiers(t.Route, "tiers", t.Tiers); err != nil {
		return err
	}
	c := t.Canary
	if c == nil {
		return nil
	}
	if c.Weight < 0 || c.Weight > 100 {
		return fmt.Errorf("peers table %s: canary weight %d is not 0-100", t.Route, c.Weight)
	}
	for _, h := range []struct{ field, name string }{{"sticky_header", c.StickyHeader}, {"override_header", c.OverrideHeader}} {
		if err := CheckHeaderName(h.name); err != nil {
			return fmt.Errorf("peers table %s: canary.%s: %w", t.Route, h.field, err)
		}
	}
	if err := CheckCookieName(c.StickyCookie); err != nil {
		return fmt.Errorf("peers table %s: canary.sticky_cookie: %w", t.Route, err)
	}
	return checkTiers(t.Route, "canary.tiers", c.Tiers)
}

func checkTiers(route, where string, tiers []Tier) error {
	for i, tr := range tiers {
		if tr.Use == "" {
			return fmt.Errorf("peers table %s: %s[%d]: no use", route, where, i)
		}
		if tr.MaxConcurrency < 0 {
			return fmt.Errorf("peers table %s: %s[%d]: max_concurrency %d is negative (0 = no limit)", route, where, i, tr.MaxConcurrency)
		}
		for j, p := range tr.Peers {
			if err := CheckHost(p.Host); err != nil {
				return fmt.Errorf("peers table %s: %s[%d].peers[%d]: %w", route, where, i, j, err)
			}
			if p.Port < 1 || p.Port > 65535 {
				return fmt.Errorf("peers table %s: %s[%d].peers[%d]: host %q port %d is not an address: the port must be 1-65535", route, where, i, j, p.Host, p.Port)
			}
		}
	}
	return nil
}

// CheckHost accepts an address nginx dials without a resolver: an IPv4
// dotted quad (four decimal numbers 0–255, no leading zero) or an IPv6
// address (any text form, an embedded IPv4 tail included) without zone and
// without brackets. It refuses a hostname, a port suffix, a prefix length
// and any space.
func CheckHost(host string) error {
	a, err := netip.ParseAddr(host)
	switch {
	case host == "":
		return errors.New("host is empty: it must be an IP address")
	case err != nil:
		hint := "an IPv4 dotted quad or an IPv6 address without brackets"
		if strings.HasPrefix(host, "[") {
			hint = "an IPv6 address without brackets"
		} else if strings.Count(host, ":") == 1 {
			hint = "an IP address without a port (the port is its own field)"
		}
		return fmt.Errorf("host %q is not an IP address nginx can dial: it must be %s (no hostname: the engine does not resolve names)", host, hint)
	case a.Zone() != "":
		return fmt.Errorf("host %q has a zone: only addresses without one can be dialled from every pod", host)
	}
	return nil
}

// maxNameLen bounds a header or cookie name (as the schema does).
const maxNameLen = 64

// CheckHeaderName accepts a request header name as the engine reads it,
// through nginx's $http_<name> (lower-cased, '-' as '_'): 1 to 64
// letters, digits and '-'. An '_' is refused: nginx drops request headers
// with one (underscores_in_headers off), so no request could carry it.
func CheckHeaderName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("header name %q is not 1 to %d characters long", name, maxNameLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return fmt.Errorf("header name %q has %q: only letters, digits and '-' can be read as $http_<name>", name, rune(c))
		}
	}
	return nil
}

// CheckCookieName accepts an RFC 6265 cookie name: a token of RFC 7230
// (letters, digits and !#$%&'*+-.^_`|~), 1 to 64 of them, so no space,
// '=', ';', ',', '/' or quote.
func CheckCookieName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("cookie name %q is not 1 to %d characters long", name, maxNameLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return fmt.Errorf("cookie name %q has %q: a cookie name is a token (letters, digits and !#$%%&'*+-.^_`|~)", name, rune(c))
		}
	}
	return nil
}

// ParseSerial reads the SerialHeader of a push: decimal digits only (no
// sign, no space; leading zeros are no digits of the value), 0 to
// MaxSerial.
func ParseSerial(s string) (int64, error) {
	bad := fmt.Errorf("serial %q is not a whole number from 0 to 2^53 in decimal digits", s)
	if s == "" {
		return 0, bad
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, bad
		}
	}
	if d := strings.TrimLeft(s, "0"); d != "" {
		s = d
	} else {
		s = "0"
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n > MaxSerial {
		return 0, bad
	}
	return int64(n), nil
}

// ParseFile reads the table file of ConfigMap key (peers_<route>.json):
// Parse, and the table's route must be the key's. A table is pushed to
// the route its key names; one whose route field names another route
// would either reach no route or replace that route's table.
func ParseFile(key string, b []byte) (Table, error) {
	route, ok := RouteOfKey(key)
	if !ok {
		return Table{}, fmt.Errorf("%s is not a peers table key (peers_<route>.json)", key)
	}
	t, err := Parse(b)
	if err != nil {
		return Table{}, fmt.Errorf("%s: %w", key, err)
	}
	if t.Route != route {
		return Table{}, fmt.Errorf("%s: the table is for route %q, not %q, the route its key names: the key and the route field must agree (the controller writes peers_<route>.json with route <route>)", key, t.Route, route)
	}
	return t, nil
}
