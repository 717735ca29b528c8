// Command reload is the reload sidecar: it watches a mounted ConfigMap
// directory (or one ConfigMap through the API), and on a settled change
// validates the configuration, removes stale unix sockets, sends SIGHUP to
// the consumer's main process and verifies the reload. See docs/reload.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/modelsphere/autoconfig/internal/reload"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("reload", flag.ContinueOnError)
	var o reload.Options
	o.AddFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: reload --watch DIR --process MATCH [flags]\n\nEvery flag can also be set by its PS_ environment variable (--check-cmd: %s).\n\n", reload.EnvName("check-cmd"))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "reload: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := reload.ApplyEnv(fs, os.LookupEnv); err != nil {
		fmt.Fprintf(os.Stderr, "reload: %v\n", err)
		return 2
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "reload: %v\n", err)
		return 2
	}
	log := o.NewLogger()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := reload.Run(ctx, o, log); err != nil {
		log.Error("reload sidecar stopped", "err", err)
		return 1
	}
	return 0
}
