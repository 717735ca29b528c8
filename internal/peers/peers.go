// Package peers is the format of a route's peers table: the part of a
// route's output that changes with its endpoints, written apart from the
// nginx configuration when the consumer declares that its engine takes
// peers dynamically. The compiler writes it (one ConfigMap key per route),
// the reload sidecar pushes it into the running engine, the reference
// engine (deploy/openresty/lua/router.lua) reads it, and the sidecar's
// served report names the version the engine accepted. docs/lua-contract.md
// ("Dynamic peers") is the contract; Check (check.go) is its rules, the
// ones the engine applies, and testdata/corpus the cases both run.
//
// It imports nothing of Kubernetes, CUE or the compiler: the sidecar uses it.
package peers

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Format is the table format of a route without a canary. A reader
// refuses a format it does not know rather than guess.
const Format = 1

// FormatCanary is the format of a table with a canary (Table.Canary): a
// route split between two model versions. A table without one stays
// Format, byte for byte as before the canary existed.
const FormatCanary = 2

// Annotation on the consumer's routes ConfigMap declares that its engine
// takes peers dynamically ("true"): only then does the controller render
// the peers apart from the nginx configuration.
const Annotation = "routing.modelsphere.dev/dynamic-peers"

// ControlSocket is the file name of the engine's control endpoint in the
// per-route socket directory. The '@' keeps the dispatch server (whose
// route pattern is [A-Za-z0-9._-]+) from ever proxying to it.
const ControlSocket = "autoconfig@control.sock"

// SerialHeader carries a push's serial: the engine refuses a push older
// than the one it holds.
const SerialHeader = "X-Autoconfig-Serial"

const (
	keyPrefix = "peers_"
	keySuffix = ".json"
)

// Key is the ConfigMap key of a route's table: peers_<route>.json.
func Key(route string) string { return keyPrefix + route + keySuffix }

// RouteOfKey is the route of a table key, ok false for any other key.
func RouteOfKey(key string) (route string, ok bool) {
	if !strings.HasPrefix(key, keyPrefix) || !strings.HasSuffix(key, keySuffix) || len(key) <= len(keyPrefix)+len(keySuffix) {
		return "", false
	}
	return key[len(keyPrefix) : len(key)-len(keySuffix)], true
}

// IsKey reports whether key names a peers table.
func IsKey(key string) bool {
	_, ok := RouteOfKey(key)
	return ok
}

// Table is one route's peers.
type Table struct {
	// Format is the table format (Format).
	Format int `json:"format"`
	// Route is the route name (spec.nginx.route).
	Route string `json:"route"`
	// Owner is the ModelRoute that wrote the table (namespace/name): the
	// key's ownership mark, as the first line of every other key the
	// controller writes (a JSON file has no comment to carry it).
	Owner string `json:"owner,omitempty"`
	// Version identifies Tiers: the first 16 hex digits of the SHA-256 of
	// their JSON. Two tables with one version pick from the same peers.
	Version string `json:"version"`
	// Tiers are the route's peer tiers, highest priority first.
	Tiers []Tier `json:"tiers"`
	// Canary is the route's second model version (format 2 only): the
	// split's weight and keys and the canary's tiers.
	Canary *Canary `json:"canary,omitempty"`
}

// Canary is the canary version of a route: the percent of sessions (and
// of keyless requests) it serves, the request keys that choose a
// request's version, and its tiers.
type Canary struct {
	// Weight is 0–100 percent.
	Weight int32 `json:"weight"`
	// StickyHeader carries the session key.
	StickyHeader string `json:"sticky_header"`
	// OverrideHeader names the version to serve (stable or canary).
	OverrideHeader string `json:"override_header"`
	// StickyCookie is the session cookie the route sets and reads.
	StickyCookie string `json:"sticky_cookie"`
	// Tiers are the canary's tiers (as Table.Tiers; a tier may have no
	// peer).
	Tiers []Tier `json:"tiers"`
}

// Tier is one peer group, as the route file's register_route tiers.
type Tier struct {
	// Use is cart, backend or backend-svc.
	Use string `json:"use"`
	// Priority: a lower tier serves only when every peer of the higher
	// tiers is out of the pick.
	Priority int32 `json:"priority"`
	// MaxConcurrency is the per-peer limit; 0 = none.
	MaxConcurrency int64 `json:"max_concurrency,omitempty"`
	// ProbePath is the health probe path; "" = none.
	ProbePath string `json:"probe_path,omitempty"`
	// Peers are the tier's addresses.
	Peers []Peer `json:"peers"`
}

// Peer is one address: a bare IP (IPv6 without brackets) and a port.
type Peer struct {
	Host string `json:"host"`
	Port int32  `json:"port"`
}

// Peers is the number of peers over all tiers, the canary's included.
func (t Table) Peers() int {
	n := 0
	for _, tr := range t.Tiers {
		n += len(tr.Peers)
	}
	if t.Canary != nil {
		for _, tr := range t.Canary.Tiers {
			n += len(tr.Peers)
		}
	}
	return n
}

// version is the Version of a table: of its tiers' JSON (format 1), or,
// with a canary, of the JSON of {"tiers":…,"canary":…}, so a change of
// the weight alone is a new version.
func version(tiers []Tier, canary *Canary) (string, error) {
	var b []byte
	var err error
	if canary == nil {
		b, err = json.Marshal(tiers)
	} else {
		b, err = json.Marshal(struct {
			Tiers  []Tier  `json:"tiers"`
			Canary *Canary `json:"canary"`
		}{tiers, canary})
	}
	if err != nil {
		return "", err
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:8]), nil
}

func fillPeers(tiers []Tier) []Tier {
	if tiers == nil {
		tiers = []Tier{}
	}
	for i := range tiers {
		if tiers[i].Peers == nil {
			tiers[i].Peers = []Peer{}
		}
	}
	return tiers
}

// Encode is the table's file content: Format and Version set, JSON on one
// line with a trailing newline. Same tiers, same bytes. A table Check
// refuses is not encoded.
func (t Table) Encode() ([]byte, error) {
	t.Tiers = fillPeers(t.Tiers)
	t.Format = Format
	if t.Canary != nil {
		c := *t.Canary
		c.Tiers = fillPeers(slices.Clone(c.Tiers))
		t.Canary, t.Format = &c, FormatCanary
	}
	v, err := version(t.Tiers, t.Canary)
	if err != nil {
		return nil, err
	}
	t.Version = v
	// What an engine would refuse is never written.
	if err := Check(t); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(t); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Parse reads a table file. It refuses what Check refuses (an unknown
// format, a table without a route, a peer that is no IP address and port,
// …), an unknown field, and a version that does not match the tiers (a
// table edited by hand, or cut short).
func Parse(b []byte) (Table, error) {
	var t Table
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return Table{}, fmt.Errorf("peers table: %w", err)
	}
	if err := Check(t); err != nil {
		return Table{}, err
	}
	want, err := version(t.Tiers, t.Canary)
	if err != nil {
		return Table{}, err
	}
	if t.Version != want {
		return Table{}, fmt.Errorf("peers table %s: version %q does not match its tiers (%s)", t.Route, t.Version, want)
	}
	return t, nil
}
