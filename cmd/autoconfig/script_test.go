package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
)

// TestMain lets testscript run this test binary as the `autoconfig`
// command, and the pinned CUE CLI as `cue`, so scripts can show that
// `cue vet` on the schema module gives the same verdict.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"autoconfig": func() { os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) },
		"cue":        cueMain,
	})
}

// TestScripts runs every testdata/script/*.txtar. Golden sections are
// rewritten with AUTOCONFIG_UPDATE=1 (read here, inside the test, so the
// test cache notices the variable).
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:                 "../../testdata/script",
		RequireExplicitExec: true,
		UpdateScripts:       os.Getenv("AUTOCONFIG_UPDATE") == "1",
		Cmds:                map[string]func(*testscript.TestScript, bool, []string){"gen": genFile, "samples": sampleFile},
		Setup: func(env *testscript.Env) error {
			root, err := os.Getwd()
			if err != nil {
				return err
			}
			// $ROOT is the repository root: scripts read the schema module,
			// the corpus and the samples from it.
			env.Setenv("ROOT", root+"/../..")
			return nil
		},
	})
}

// repeat is a gen piece's trailing *N.
var repeat = regexp.MustCompile(`\*(\d+)$`)

// genFile is the script command `gen FILE PIECE...`: it writes FILE as the
// pieces one after another, each with Go string escapes (\n, \xff) and an
// optional trailing *N repeating it N times, so a script can make a file
// of 200 KB or 4 MiB (or with bytes that are not UTF-8) without holding it:
//
//	gen deep.yaml 'spec: ' '[*100000' ']*100000' '\n'
func genFile(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: gen FILE PIECE[*N]...")
	}
	var b strings.Builder
	for _, a := range args[1:] {
		n := 1
		if m := repeat.FindStringSubmatchIndex(a); m != nil {
			n, _ = strconv.Atoi(a[m[2]:m[3]])
			a = a[:m[0]]
		}
		piece, err := strconv.Unquote(`"` + strings.ReplaceAll(a, `"`, `\"`) + `"`)
		ts.Check(err)
		b.WriteString(strings.Repeat(piece, n))
	}
	ts.Check(os.WriteFile(ts.MkAbs(args[0]), []byte(b.String()), 0o644))
}

// sampleFile is the script command `samples FILE N`: it writes FILE as N
// copies of deploy/samples/modelroute-llm.yaml, each route its own (its
// names, route, CART ConfigMap and monitor model numbered), as a GitOps
// repository's routes rendered into one stream are.
func sampleFile(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: samples FILE N")
	}
	n, err := strconv.Atoi(args[1])
	ts.Check(err)
	sample, err := os.ReadFile(filepath.Join(ts.Getenv("ROOT"), "deploy", "samples", "modelroute-llm.yaml"))
	ts.Check(err)
	var b strings.Builder
	for i := range n {
		doc := strings.ReplaceAll(string(sample), "qwen", fmt.Sprintf("qwen%d", i))
		b.WriteString("---\n" + strings.ReplaceAll(doc, "Instruct", fmt.Sprintf("Instruct-%d", i)))
	}
	ts.Check(os.WriteFile(ts.MkAbs(args[0]), []byte(b.String()), 0o644))
}
