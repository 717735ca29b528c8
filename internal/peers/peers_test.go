package peers

import (
	"strings"
	"testing"
)

func TestEncodeParseRoundTrip(t *testing.T) {
	in := Table{Route: "qwen", Tiers: []Tier{
		{Use: "backend", Priority: 2, MaxConcurrency: 8, Peers: []Peer{{"10.0.0.1", 8000}, {"fd00::1", 8000}}},
		{Use: "backend-svc", Priority: 1, Peers: []Peer{{"10.96.0.7", 8000}}},
	}}
	b, err := in.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(b), "}\n") || strings.Count(string(b), "\n") != 1 {
		t.Fatalf("not one line with a newline: %q", b)
	}
	again, _ := in.Encode()
	if string(again) != string(b) {
		t.Fatal("two encodings of one table differ")
	}
	out, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if out.Format != Format || out.Route != "qwen" || len(out.Version) != 16 || out.Peers() != 3 {
		t.Fatalf("parsed %+v", out)
	}
	// Another peer, another version.
	in.Tiers[0].Peers = in.Tiers[0].Peers[:1]
	b2, _ := in.Encode()
	out2, err := Parse(b2)
	if err != nil {
		t.Fatal(err)
	}
	if out2.Version == out.Version {
		t.Fatal("the version did not change with the peers")
	}
}

func TestParseRefuses(t *testing.T) {
	good, _ := Table{Route: "r", Tiers: []Tier{{Use: "backend", Peers: []Peer{{"10.0.0.1", 80}}}}}.Encode()
	for name, tc := range map[string]struct{ in, want string }{
		"format 2":     {strings.Replace(string(good), `"format":1`, `"format":2`, 1), "format 2 without a canary"},
		"format 3":     {strings.Replace(string(good), `"format":1`, `"format":3`, 1), "format 3 is neither 1 nor 2"},
		"edited peers": {strings.Replace(string(good), "10.0.0.1", "10.0.0.2", 1), "does not match its tiers"},
		"no route":     {strings.Replace(string(good), `"route":"r"`, `"route":""`, 1), "no route"},
		"bad port":     {strings.Replace(string(good), `"port":80`, `"port":0`, 1), "is not an address"},
		"unknown":      {strings.Replace(string(good), `"format":1`, `"format":1,"weights":[]`, 1), "unknown field"},
		"cut short":    {string(good[:len(good)/2]), "peers table"},
	} {
		if _, err := Parse([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", name, err, tc.want)
		}
	}
}

// canaryTable is a format 2 table: stable tiers and a canary at weight.
func canaryTable(weight int32) Table {
	return Table{Route: "qwen", Owner: "llm-route/qwen", Tiers: []Tier{
		{Use: "backend", Priority: 2, MaxConcurrency: 8, Peers: []Peer{{"10.0.0.1", 8000}}},
	}, Canary: &Canary{Weight: weight, StickyHeader: "x-session-id", OverrideHeader: "x-model-version", StickyCookie: "autoconfig-session",
		Tiers: []Tier{{Use: "canary", Priority: 2, MaxConcurrency: 8, Peers: []Peer{{"10.0.1.1", 8000}, {"10.0.1.2", 8000}}}}}}
}

// TestCanaryFormat: a table with a canary is format 2 and round-trips; the
// weight alone changes its version (a ramp is a new table); a table
// without one stays format 1 with the version of its tiers alone, exactly
// the bytes written before the canary existed.
func TestCanaryFormat(t *testing.T) {
	b, err := canaryTable(10).Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"format":2,"route":"qwen","owner":"llm-route/qwen","version":"` // version checked below
	if !strings.HasPrefix(string(b), want) || !strings.Contains(string(b), `"canary":{"weight":10,"sticky_header":"x-session-id","override_header":"x-model-version","sticky_cookie":"autoconfig-session","tiers":[{"use":"canary","priority":2,"max_concurrency":8,"peers":[{"host":"10.0.1.1","port":8000},{"host":"10.0.1.2","port":8000}]}]}}`) {
		t.Fatalf("format 2 table: %s", b)
	}
	out, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if out.Format != FormatCanary || out.Canary == nil || out.Canary.Weight != 10 || out.Peers() != 3 {
		t.Fatalf("parsed %+v", out)
	}
	b25, _ := canaryTable(25).Encode()
	out25, err := Parse(b25)
	if err != nil {
		t.Fatal(err)
	}
	if out25.Version == out.Version {
		t.Fatal("a new weight kept the version: the engine would not take the ramp")
	}
	// Without the canary: format 1, the version of the tiers alone (the
	// same computation as before format 2: 3395d7cc79d7accf is the first
	// 16 hex digits of the SHA-256 of the tiers' JSON, as sha256sum gives).
	plain := canaryTable(10)
	plain.Canary = nil
	b1, _ := plain.Encode()
	if !strings.HasPrefix(string(b1), `{"format":1,`) || strings.Contains(string(b1), "canary") {
		t.Fatalf("table without canary: %s", b1)
	}
	if string(b1) != `{"format":1,"route":"qwen","owner":"llm-route/qwen","version":"3395d7cc79d7accf","tiers":[{"use":"backend","priority":2,"max_concurrency":8,"peers":[{"host":"10.0.0.1","port":8000}]}]}`+"\n" {
		t.Fatalf("format 1 bytes changed: %s", b1)
	}
	// An empty canary tier (no canary endpoint) is written as [] peers.
	empty := canaryTable(10)
	empty.Canary.Tiers[0].Peers = nil
	be, _ := empty.Encode()
	if _, err := Parse(be); err != nil || !strings.Contains(string(be), `"use":"canary","priority":2,"max_concurrency":8,"peers":[]`) {
		t.Fatalf("empty canary: %v %s", err, be)
	}
	// Refusals.
	for name, tc := range map[string]struct{ in, want string }{
		"format 1 with canary": {strings.Replace(string(b), `"format":2`, `"format":1`, 1), "format 1 has no canary"},
		"weight edited":        {strings.Replace(string(b), `"weight":10`, `"weight":11`, 1), "does not match"},
		"weight 101":           {strings.Replace(string(b), `"weight":10`, `"weight":101`, 1), "not 0-100"},
		"canary bad port":      {strings.Replace(string(b), `"host":"10.0.1.1","port":8000`, `"host":"10.0.1.1","port":0`, 1), "canary.tiers[0].peers[0]"},
	} {
		if _, err := Parse([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", name, err, tc.want)
		}
	}
	if _, err := canaryTable(-1).Encode(); err == nil {
		t.Error("weight -1 encoded")
	}
}

func TestKey(t *testing.T) {
	if Key("qwen-7b") != "peers_qwen-7b.json" {
		t.Fatal(Key("qwen-7b"))
	}
	for key, want := range map[string]string{"peers_qwen-7b.json": "qwen-7b", "peers_.json": "", "session_route_x.conf": "", "peers_x.conf": ""} {
		got, ok := RouteOfKey(key)
		if got != want || ok != (want != "") {
			t.Errorf("RouteOfKey(%q) = %q, %v", key, got, ok)
		}
	}
}
