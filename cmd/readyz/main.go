// Command readyz is a sidecar that serves GET /readyz, answering 503 while
// a required local TCP port has no LISTEN socket in the pod's network
// namespace. See docs/readyz.md and internal/readiness.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
}

// run parses the options and serves until SIGINT or SIGTERM. It returns
// the exit code: 0, 1 for a runtime failure, 2 for a usage error.
func run(args []string, lookup func(string) (string, bool), stdout, stderr io.Writer) int {
	o, code, ok := parseOptions(args, lookup, stdout, stderr)
	if !ok {
		return code
	}
	logger := o.newLogger(stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, o, logger); err != nil {
		logger.Error("readyz failed", "error", err)
		return 1
	}
	return 0
}
