package peers

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// corpusRoute is the route of every corpus table but the one without a
// route: an engine test pushes each to a route of that name.
const corpusRoute = "corpus"

// corpusCase is one table of the shared corpus: edit changes a sound
// table (corpusTable's) and want is "" for a table an engine takes, else a
// part of the refusal's error (so the message stays one a person can act
// on).
type corpusCase struct {
	name string
	edit func(t *Table)
	want string // "" = ok
}

func peer(host string, port int32) Peer { return Peer{Host: host, Port: port} }

// host replaces the first peer's host.
func host(h string) func(*Table) { return func(t *Table) { t.Tiers[0].Peers[0].Host = h } }

func port(p int32) func(*Table) { return func(t *Table) { t.Tiers[0].Peers[0].Port = p } }

func withCanary(f func(c *Canary)) func(*Table) {
	return func(t *Table) {
		t.Canary = &Canary{Weight: 10, StickyHeader: "x-session-id", OverrideHeader: "x-model-version", StickyCookie: "autoconfig-session",
			Tiers: []Tier{{Use: "canary", Priority: 2, MaxConcurrency: 8, Peers: []Peer{peer("10.0.1.1", 8000)}}}}
		if f != nil {
			f(t.Canary)
		}
	}
}

// corpusCases are the cases of testdata/corpus: what an engine must take
// (ok) and refuse. Every table's version matches its tiers (but
// no-version's, which has none), so a verdict never depends on
// recomputing a version, which an engine does not do.
var corpusCases = []corpusCase{
	{name: "ipv4", edit: nil},
	{name: "ipv6", edit: host("fd00::1")},
	{name: "ipv6-loopback", edit: host("::1")},
	{name: "ipv6-upper-case", edit: host("FD00::A")},
	{name: "ipv6-uncompressed", edit: host("2001:0db8:0000:0000:0000:0000:0000:0001")},
	{name: "ipv6-ipv4-tail", edit: host("::ffff:10.0.0.1")},
	{name: "ports-1-and-65535", edit: func(t *Table) { t.Tiers[0].Peers = []Peer{peer("10.0.0.1", 1), peer("10.0.0.2", 65535)} }},
	{name: "tier-without-peers", edit: func(t *Table) { t.Tiers[1].Peers = []Peer{} }},
	{name: "no-tiers", edit: func(t *Table) { t.Tiers = []Tier{} }},
	{name: "max-concurrency-0", edit: func(t *Table) { t.Tiers[0].MaxConcurrency = 0 }},
	{name: "canary", edit: withCanary(nil)},
	{name: "canary-weight-0", edit: withCanary(func(c *Canary) { c.Weight = 0 })},
	{name: "canary-weight-100", edit: withCanary(func(c *Canary) { c.Weight = 100 })},
	{name: "canary-header-upper-case", edit: withCanary(func(c *Canary) { c.StickyHeader, c.OverrideHeader = "X-Session-Id", "X-MODEL-VERSION" })},
	{name: "canary-names-64-characters", edit: withCanary(func(c *Canary) {
		c.StickyHeader, c.OverrideHeader, c.StickyCookie = strings.Repeat("s", 64), strings.Repeat("o", 64), strings.Repeat("c", 64)
	})},
	{name: "canary-cookie-token-characters", edit: withCanary(func(c *Canary) { c.StickyCookie = "a!#$%&'*+-.^_`|~Z9" })},
	{name: "canary-without-peers", edit: withCanary(func(c *Canary) { c.Tiers[0].Peers = []Peer{} })},

	{name: "host-empty", edit: host(""), want: "host is empty"},
	{name: "host-hostname", edit: host("qwen.llm.svc.cluster.local"), want: "no hostname"},
	{name: "host-localhost", edit: host("localhost"), want: "not an IP address"},
	{name: "host-with-port", edit: host("10.0.0.1:8000"), want: "without a port"},
	{name: "host-ipv6-brackets", edit: host("[fd00::1]"), want: "without brackets"},
	{name: "host-ipv6-brackets-port", edit: host("[fd00::1]:8000"), want: "without brackets"},
	{name: "host-ipv6-zone", edit: host("fe80::1%eth0"), want: "has a zone"},
	{name: "host-ipv6-malformed", edit: host("fd00:::1"), want: "not an IP address"},
	{name: "host-leading-space", edit: host(" 10.0.0.1"), want: "not an IP address"},
	{name: "host-trailing-space", edit: host("10.0.0.1 "), want: "not an IP address"},
	{name: "host-inner-space", edit: host("10.0.0. 1"), want: "not an IP address"},
	{name: "host-leading-zero", edit: host("10.0.0.01"), want: "not an IP address"},
	{name: "host-three-numbers", edit: host("10.0.1"), want: "not an IP address"},
	{name: "host-octet-256", edit: host("10.0.0.256"), want: "not an IP address"},
	{name: "host-prefix-length", edit: host("10.0.0.0/8"), want: "not an IP address"},
	{name: "host-second-tier", edit: func(t *Table) { t.Tiers[1].Peers[0].Host = "backend-svc" }, want: "tiers[1].peers[0]"},
	{name: "port-0", edit: port(0), want: "port must be 1-65535"},
	{name: "port-65536", edit: port(65536), want: "port must be 1-65535"},
	{name: "port-negative", edit: port(-1), want: "port must be 1-65535"},
	{name: "tier-without-use", edit: func(t *Table) { t.Tiers[0].Use = "" }, want: "no use"},
	{name: "max-concurrency-negative", edit: func(t *Table) { t.Tiers[0].MaxConcurrency = -1 }, want: "max_concurrency -1 is negative"},
	{name: "format-0", edit: func(t *Table) { t.Format = 0 }, want: "format 0 is neither"},
	{name: "format-3", edit: func(t *Table) { t.Format = 3 }, want: "format 3 is neither"},
	{name: "format-1-with-canary", edit: func(t *Table) { withCanary(nil)(t); t.Format = Format }, want: "format 1 has no canary"},
	{name: "format-2-without-canary", edit: func(t *Table) { t.Format = FormatCanary }, want: "format 2 without a canary"},
	{name: "no-route", edit: func(t *Table) { t.Route = "" }, want: "no route"},
	{name: "no-version", edit: func(t *Table) { t.Version = "" }, want: "no version"},
	{name: "canary-weight-101", edit: withCanary(func(c *Canary) { c.Weight = 101 }), want: "not 0-100"},
	{name: "canary-weight-negative", edit: withCanary(func(c *Canary) { c.Weight = -1 }), want: "not 0-100"},
	{name: "canary-sticky-header-empty", edit: withCanary(func(c *Canary) { c.StickyHeader = "" }), want: "canary.sticky_header"},
	{name: "canary-override-header-empty", edit: withCanary(func(c *Canary) { c.OverrideHeader = "" }), want: "canary.override_header"},
	{name: "canary-cookie-empty", edit: withCanary(func(c *Canary) { c.StickyCookie = "" }), want: "canary.sticky_cookie"},
	{name: "canary-sticky-header-65-characters", edit: withCanary(func(c *Canary) { c.StickyHeader = strings.Repeat("s", 65) }), want: "not 1 to 64 characters"},
	{name: "canary-cookie-65-characters", edit: withCanary(func(c *Canary) { c.StickyCookie = strings.Repeat("c", 65) }), want: "not 1 to 64 characters"},
	{name: "canary-sticky-header-underscore", edit: withCanary(func(c *Canary) { c.StickyHeader = "x_session_id" }), want: "canary.sticky_header"},
	{name: "canary-sticky-header-space", edit: withCanary(func(c *Canary) { c.StickyHeader = "x session" }), want: "only letters, digits and '-'"},
	{name: "canary-sticky-header-dot", edit: withCanary(func(c *Canary) { c.StickyHeader = "x.session" }), want: "only letters, digits and '-'"},
	{name: "canary-sticky-header-non-ascii", edit: withCanary(func(c *Canary) { c.StickyHeader = "x-séssion" }), want: "only letters, digits and '-'"},
	{name: "canary-override-header-colon", edit: withCanary(func(c *Canary) { c.OverrideHeader = "x-model-version:" }), want: "canary.override_header"},
	{name: "canary-cookie-space", edit: withCanary(func(c *Canary) { c.StickyCookie = "my session" }), want: "canary.sticky_cookie"},
	{name: "canary-cookie-equals", edit: withCanary(func(c *Canary) { c.StickyCookie = "a=b" }), want: "a cookie name is a token"},
	{name: "canary-cookie-semicolon", edit: withCanary(func(c *Canary) { c.StickyCookie = "a;b" }), want: "a cookie name is a token"},
	{name: "canary-cookie-comma", edit: withCanary(func(c *Canary) { c.StickyCookie = "a,b" }), want: "a cookie name is a token"},
	{name: "canary-cookie-slash", edit: withCanary(func(c *Canary) { c.StickyCookie = "a/b" }), want: "a cookie name is a token"},
	{name: "canary-cookie-quote", edit: withCanary(func(c *Canary) { c.StickyCookie = `"a"` }), want: "a cookie name is a token"},
	{name: "canary-host-hostname", edit: withCanary(func(c *Canary) { c.Tiers[0].Peers[0].Host = "canary.llm" }), want: "canary.tiers[0].peers[0]"},
	{name: "canary-port-0", edit: withCanary(func(c *Canary) { c.Tiers[0].Peers[0].Port = 0 }), want: "canary.tiers[0].peers[0]"},
}

// corpusTable is the case's table and its file content: the sound table,
// edited, with the version of its tiers (unless the edit cleared it) and
// the format the canary calls for (unless the edit set one), encoded as
// Encode does but without Check.
func corpusTable(c corpusCase) (Table, []byte, error) {
	t := Table{Format: -1, Route: corpusRoute, Owner: "llm/corpus", Version: "-", Tiers: []Tier{
		{Use: "backend", Priority: 2, MaxConcurrency: 8, ProbePath: "/v1/models", Peers: []Peer{peer("10.0.0.1", 8000), peer("10.0.0.2", 8001)}},
		{Use: "backend-svc", Priority: 1, Peers: []Peer{peer("10.96.0.10", 8000)}},
	}}
	if c.edit != nil {
		c.edit(&t)
	}
	if t.Format == -1 {
		t.Format = Format
		if t.Canary != nil {
			t.Format = FormatCanary
		}
	}
	if t.Version == "-" {
		v, err := version(t.Tiers, t.Canary)
		if err != nil {
			return t, nil, err
		}
		t.Version = v
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	err := enc.Encode(t)
	return t, buf.Bytes(), err
}

// serialCases are testdata/serials.txt: values of the SerialHeader.
var serialCases = []struct {
	value string
	ok    bool
}{
	{"0", true}, {"1", true}, {"007", true}, {"000", true}, {"1767225600000", true}, {"9007199254740992", true},
	{"00000000000000000000009007199254740992", true},
	{"9007199254740993", false}, {"18446744073709551616", false}, {"-1", false}, {"+1", false},
	{"1.5", false}, {"1e3", false}, {"0x10", false}, {"x1", false},
}

func verdict(ok bool) string {
	if ok {
		return "ok"
	}
	return "refuse"
}

// readVerdicts reads "<name> ok|refuse" lines.
func readVerdicts(t *testing.T, path string) ([]string, map[string]string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var order []string
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 || (fields[1] != "ok" && fields[1] != "refuse") {
			t.Fatalf("%s: line %q is not \"<name> ok|refuse\"", path, sc.Text())
		}
		if _, dup := out[fields[0]]; dup {
			t.Fatalf("%s: %s twice", path, fields[0])
		}
		order = append(order, fields[0])
		out[fields[0]] = fields[1]
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return order, out
}

// TestCorpus: testdata/corpus is exactly what corpusCases generate (run
// "AUTOCONFIG_UPDATE=1 go test ./internal/peers -run TestCorpus" after
// changing them; read here, inside the test, so the test cache notices), Parse gives every file its verdict, a refusal names the rule,
// and every refused table is refused by Check itself: the version (which
// only Parse recomputes) decides no verdict. The reference engine's test
// runs the same files.
func TestCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "corpus")
	files := map[string][]byte{}
	var verdicts bytes.Buffer
	names := make([]string, 0, len(corpusCases))
	want := map[string]string{}
	for _, c := range corpusCases {
		if _, dup := want[c.name]; dup {
			t.Fatalf("case %s twice", c.name)
		}
		want[c.name] = c.want
		names = append(names, c.name)
		_, b, err := corpusTable(c)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		files[c.name+".json"] = b
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(&verdicts, "%s %s\n", n, verdict(want[n] == ""))
	}
	files["verdicts.txt"] = verdicts.Bytes()
	var serials bytes.Buffer
	for _, s := range serialCases {
		fmt.Fprintf(&serials, "%s %s\n", s.value, verdict(s.ok))
	}
	if os.Getenv("AUTOCONFIG_UPDATE") == "1" {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join("testdata", "serials.txt"), serials.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != len(files) {
		t.Errorf("%s holds %d files, corpusCases make %d (AUTOCONFIG_UPDATE=1 go test -run TestCorpus)", dir, len(ents), len(files))
	}
	for name, b := range files {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(got, b) {
			t.Errorf("%s/%s differs from corpusCases (AUTOCONFIG_UPDATE=1 go test -run TestCorpus): %v", dir, name, err)
		}
	}
	if got, err := os.ReadFile(filepath.Join("testdata", "serials.txt")); err != nil || !bytes.Equal(got, serials.Bytes()) {
		t.Errorf("testdata/serials.txt differs from serialCases (AUTOCONFIG_UPDATE=1 go test -run TestCorpus): %v", err)
	}

	// The files on disk, read as an engine's test reads them.
	order, onDisk := readVerdicts(t, filepath.Join(dir, "verdicts.txt"))
	if !slices.IsSorted(order) {
		t.Errorf("verdicts.txt is not sorted by name")
	}
	refused := 0
	for _, name := range order {
		b, err := os.ReadFile(filepath.Join(dir, name+".json"))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		_, perr := Parse(b)
		if got := verdict(perr == nil); got != onDisk[name] {
			t.Errorf("%s: Parse says %s (%v), verdicts.txt %s", name, got, perr, onDisk[name])
			continue
		}
		if perr != nil {
			refused++
			if !strings.Contains(perr.Error(), want[name]) {
				t.Errorf("%s: refused with %q, want it to say %q", name, perr, want[name])
			}
			var tab Table
			if err := json.Unmarshal(b, &tab); err != nil {
				t.Errorf("%s: does not decode: %v (a corpus table is refused by a rule, not by its JSON)", name, err)
			} else if Check(tab) == nil {
				t.Errorf("%s: Check takes it; only its version makes Parse refuse it", name)
			}
		}
	}
	if refused == 0 || refused == len(order) {
		t.Errorf("%d of %d corpus tables refused: the corpus needs both verdicts", refused, len(order))
	}
}

// TestParseSerial: testdata/serials.txt, as ParseSerial reads the header.
func TestParseSerial(t *testing.T) {
	order, want := readVerdicts(t, filepath.Join("testdata", "serials.txt"))
	if len(order) != len(serialCases) {
		t.Fatalf("serials.txt has %d cases, serialCases %d (AUTOCONFIG_UPDATE=1 go test -run TestCorpus)", len(order), len(serialCases))
	}
	for _, v := range order {
		n, err := ParseSerial(v)
		if got := verdict(err == nil); got != want[v] {
			t.Errorf("ParseSerial(%q) = %d, %v: %s, want %s", v, n, err, got, want[v])
		}
	}
	if n, err := ParseSerial("9007199254740992"); err != nil || n != MaxSerial {
		t.Errorf("ParseSerial(2^53) = %d, %v", n, err)
	}
	for _, v := range []string{"", " 1", "1 "} {
		if _, err := ParseSerial(v); err == nil || !strings.Contains(err.Error(), "from 0 to 2^53") {
			t.Errorf("ParseSerial(%q): %v", v, err)
		}
	}
}

// TestParseFile: a table is read for the route its key names; one whose
// route field names another route is refused, with both names.
func TestParseFile(t *testing.T) {
	b, err := Table{Route: "qwen", Tiers: []Tier{{Use: "backend", Peers: []Peer{peer("10.0.0.1", 8000)}}}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if tab, err := ParseFile(Key("qwen"), b); err != nil || tab.Route != "qwen" {
		t.Fatalf("ParseFile(%s) = %+v, %v", Key("qwen"), tab, err)
	}
	if _, err := ParseFile(Key("ghost"), b); err == nil || !strings.Contains(err.Error(), `for route "qwen", not "ghost"`) {
		t.Errorf("a table of qwen under %s: %v, want a refusal naming both routes", Key("ghost"), err)
	}
	if _, err := ParseFile("qwen.conf", b); err == nil {
		t.Error("ParseFile took a key that is no peers table's")
	}
	if _, err := ParseFile(Key("qwen"), b[:10]); err == nil || !strings.Contains(err.Error(), Key("qwen")) {
		t.Errorf("a cut table: %v, want an error naming the key", err)
	}
}

// TestEncodeRefusesWhatCheckRefuses: the compiler cannot write a table
// an engine would refuse.
func TestEncodeRefusesWhatCheckRefuses(t *testing.T) {
	for name, tab := range map[string]Table{
		"hostname": {Route: "r", Tiers: []Tier{{Use: "backend", Peers: []Peer{peer("backend.local", 80)}}}},
		"no route": {Tiers: []Tier{}},
		"cookie":   {Route: "r", Canary: &Canary{Weight: 5, StickyCookie: "a b"}},
	} {
		if b, err := tab.Encode(); err == nil {
			t.Errorf("%s: encoded %s", name, b)
		}
	}
}
