package main

import (
	"os"

	cuecmd "cuelang.org/go/cmd/cue/cmd"
)

// cueMain runs the pinned CUE CLI inside test scripts (`exec cue …`), the
// same binary `go tool cue` runs for users.
func cueMain() { os.Exit(cuecmd.Main()) }
