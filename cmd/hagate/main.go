// Command hagate keeps one replica of a stateful router active by leader
// election on a Lease and a pod label. See docs/hagate.md and
// internal/hagate.
package main

import (
	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/internal/hagate"
)

func main() { cli.Main(hagate.Command(hagate.Run)) }
