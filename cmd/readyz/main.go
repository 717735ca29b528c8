// Command readyz is a sidecar that serves GET /readyz, answering 503 while
// a required local TCP port has no LISTEN socket in the pod's network
// namespace. See docs/readyz.md and internal/readyz.
package main

import (
	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/internal/readyz"
)

func main() { cli.Main(readyz.Command(readyz.Run)) }
