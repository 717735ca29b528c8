// Command autoconfig is the ModelRoute control plane's one CLI:
//
//	autoconfig vet FILE|DIR|- ...        validate ModelRoute YAML
//	autoconfig compile -f ROUTE ...      render a route's outputs from files
//	autoconfig controller [flags]        run the in-cluster reconciler
//	autoconfig crd                       print the generated CRD
//	autoconfig version                   print the version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// Version is set at build time with -ldflags "-X main.Version=…"; the Helm
// chart's appVersion follows it.
var Version = "0.1.0"

// command is one subcommand. run returns the process exit code: 0 success,
// 1 failure (e.g. an invalid route), 2 usage error.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int
}

// commands is filled by the files that implement each subcommand.
var commands = map[string]command{
	"version": {summary: "print the version", run: func(_ context.Context, _ []string, _ io.Reader, stdout, _ io.Writer) int {
		fmt.Fprintf(stdout, "autoconfig %s\n", Version)
		return 0
	}},
}

func main() { os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }

// Main runs the CLI with args (without the program name) and returns the
// exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		w := stdout
		code := 0
		if len(args) == 0 {
			w, code = stderr, 2
		}
		usage(w)
		return code
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "autoconfig: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return c.run(ctx, args[1:], stdin, stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "autoconfig keeps the LLM routing layer's backend lists in step with the cluster.")
	fmt.Fprintln(w, "\nUsage: autoconfig <command> [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-11s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'autoconfig <command> --help' for a command's flags.")
}

// joinLines is a small helper for multi-line usage texts.
func joinLines(lines ...string) string { return strings.Join(lines, "\n") + "\n" }

// parseFlags is every subcommand's flag handling: a FlagSet named name
// writing to stderr, the flags addFlags registers, usage (printed before
// the flag defaults) on -h and on errors. ok is false when the caller must
// return code: 0 after --help, 2 on a usage error.
func parseFlags(name string, args []string, stderr io.Writer, usage string, addFlags func(*flag.FlagSet)) (fs *flag.FlagSet, code int, ok bool) {
	fs = flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return fs, 0, false
		}
		return fs, 2, false
	}
	return fs, 0, true
}
