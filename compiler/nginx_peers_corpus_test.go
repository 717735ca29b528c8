package compiler

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// TestNginxPeersCorpusAgrees: the engine's control endpoint and the reload
// sidecar's check (internal/peers) are one rule set. Every table of the
// shared corpus (internal/peers/testdata/corpus: <name>.json and its
// verdict in verdicts.txt, which peers.TestCorpus holds the Go side to) is
// taken by the real engine (200) exactly when its verdict is ok and
// refused (400) exactly when it is refuse; every serial of
// testdata/serials.txt is parsed (200, or 409 when lower than the stored
// one) exactly when its verdict is ok.
func TestNginxPeersCorpusAgrees(t *testing.T) {
	dir := filepath.Join(testbin.Root(t), "internal", "peers", "testdata")
	n := startDynamic(t)
	installDynamic(t, n, "corpus", dynamicLLMConf(t, n, llmRoute("corpus", nil, backendTier)))
	installDynamic(t, n, "serials", dynamicLLMConf(t, n, llmRoute("serials", nil, backendTier)))
	c := controlClient(n)

	verdicts := readVerdicts(t, filepath.Join(dir, "corpus", "verdicts.txt"))
	if len(verdicts) < 40 {
		t.Fatalf("only %d corpus verdicts", len(verdicts))
	}
	serial := int64(0)
	for _, v := range verdicts {
		body, err := os.ReadFile(filepath.Join(dir, "corpus", v[0]+".json"))
		if err != nil {
			t.Fatal(err)
		}
		serial++
		code, _, raw := control(t, c, "PUT", "/peers/corpus", body, serial, nil)
		want := map[string]int{"ok": 200, "refuse": 400}[v[1]]
		if code != want {
			t.Errorf("corpus %s (%s): the engine answered %d %s", v[0], v[1], code, raw)
		}
		_, goErr := peers.ParseFile("peers_corpus.json", body)
		if (goErr == nil) != (v[1] == "ok") {
			t.Errorf("corpus %s (%s): peers.ParseFile: %v", v[0], v[1], goErr)
		}
	}

	_, good := table(t, "serials", backendPeers(peers.Peer{Host: "127.0.0.1", Port: 9}))
	for _, v := range readVerdicts(t, filepath.Join(dir, "serials.txt")) {
		code, _, raw := control(t, c, "PUT", "/peers/serials", good, -1, map[string]string{peers.SerialHeader: v[0]})
		parsed := code == 200 || code == 409
		if parsed != (v[1] == "ok") || (!parsed && code != 400) {
			t.Errorf("serial %q (%s): the engine answered %d %s", v[0], v[1], code, raw)
		}
	}
}

// readVerdicts reads "<name> ok|refuse" lines.
func readVerdicts(t *testing.T, path string) [][2]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][2]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 || (fields[1] != "ok" && fields[1] != "refuse") {
			t.Fatalf("%s: bad line %q", path, sc.Text())
		}
		out = append(out, [2]string{fields[0], fields[1]})
	}
	return out
}
