package main

import (
	"os"
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
