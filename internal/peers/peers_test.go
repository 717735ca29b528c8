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
		"format 2":     {strings.Replace(string(good), `"format":1`, `"format":2`, 1), "format 2 is not 1"},
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
