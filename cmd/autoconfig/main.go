// Command autoconfig is the ModelRoute control plane's one CLI:
//
//	autoconfig vet FILE|DIR|- ...        validate ModelRoute YAML
//	autoconfig compile -f ROUTE ...      render a route's outputs from files
//	autoconfig diff [NAME ...]           diff what the controller would write
//	autoconfig delete-routes -l SELECTOR delete routes, wait for their cleanup
//	autoconfig controller [flags]        run the in-cluster reconciler
//	autoconfig crd                       print the generated CRD
//	autoconfig version                   print the version
//
// The command tree is built on internal/cli, the entry point the sidecars
// share.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/modelsphere/autoconfig/internal/cli"
)

func main() { os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }

// Main runs the CLI with args (without the program name) and returns the
// exit code: 0 success, 1 failure (e.g. an invalid route), 2 usage error.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return cli.Execute(rootCommand(), args, cli.IO{Stdin: stdin, Stdout: stdout, Stderr: stderr, LookupEnv: os.LookupEnv})
}

func rootCommand() *cli.Command {
	return &cli.Command{
		Use:     "autoconfig <command> [flags]",
		Long:    "autoconfig keeps the LLM routing layer's backend lists in step with the cluster.",
		Version: cli.Version,
		Commands: []*cli.Command{
			compileCommand(),
			controllerCommand(),
			crdCommand(),
			deleteRoutesCommand(),
			diffCommand(),
			vetCommand(),
			{
				Use:   "version",
				Short: "print the version",
				Run: func(_ context.Context, c *cli.Call) error {
					_, err := fmt.Fprintf(c.Stdout, "autoconfig %s\n", cli.VersionString())
					return err
				},
			},
		},
	}
}
