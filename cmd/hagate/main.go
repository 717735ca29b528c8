// Command hagate keeps one replica of a stateful router active by leader
// election on a Lease and a pod label. See docs/hagate.md.
package main

import (
	"os"

	"github.com/modelsphere/autoconfig/internal/hagate"
)

func main() {
	os.Exit(hagate.Main(os.Args[1:], os.LookupEnv, os.Stderr))
}
