// Command reload is the reload sidecar: it watches a mounted ConfigMap
// directory (or one ConfigMap through the API), and on a settled change
// validates the configuration, removes stale unix sockets, sends SIGHUP to
// the consumer's main process and verifies the reload. See docs/reload.md
// and internal/reload.
package main

import (
	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/internal/reload"
)

func main() { cli.Main(reload.Command(reload.Run)) }
