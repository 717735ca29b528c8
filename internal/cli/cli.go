// Package cli is the one entry point of the four binaries (autoconfig and
// the reload, hagate and readyz sidecars). A Command becomes a cobra
// command that parses its flags, fills every flag not given on the command
// line from its PS_ environment variable (sidecars), validates the
// options, builds the slog logger of --log-level/--log-format and runs
// under a context cancelled by SIGINT or SIGTERM. The outcome is the exit
// code: 0 ok, 1 runtime failure, 2 usage error.
//
// It imports nothing heavy (no client-go, no controller-runtime, no CUE),
// so the sidecars that use it stay small.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Version is the version of all four binaries (autoconfig, reload, hagate,
// readyz), printed by --version. Builds set it with
// -ldflags "-X github.com/modelsphere/autoconfig/internal/cli.Version=…";
// the Helm chart's version and appVersion follow it (a test checks).
var Version = "0.1.0"

// Options are a command's settings: flags registered on a FlagSet, and
// a check of the parsed values (its errors are usage errors).
type Options interface {
	AddFlags(fs *pflag.FlagSet)
	Validate() error
}

// Command describes one command: a sidecar binary, the autoconfig root or
// one of its subcommands.
type Command struct {
	// Use is the synopsis: the command's name followed by its arguments,
	// e.g. "compile -f ROUTE --endpoints SNAPSHOT".
	Use   string
	Short string // one line, shown in the parent's command list
	Long  string // the help text between the synopsis and the flags

	// Options registers the command's own flags; nil for none.
	Options Options
	// Args checks the positional arguments; nil accepts none. Its errors
	// are usage errors.
	Args cobra.PositionalArgs
	// EnvName, when set, names the environment variable of each flag;
	// every flag not given on the command line is then read from it.
	EnvName func(flag string) string
	// Log adds --log-level and --log-format; Call.Log is their logger.
	Log bool
	// Version, on a root command, is printed by --version.
	Version string

	// Run does the work. A *UsageError exits 2, an ExitCode exits with its
	// code, any other error is reported and exits 1.
	Run func(ctx context.Context, c *Call) error
	// Commands are the subcommands.
	Commands []*Command
}

// Call is one run of a command.
type Call struct {
	Args   []string // positional arguments
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Log    *slog.Logger // with Command.Log; otherwise a logger to Stderr
}

// IO is the process around a command: its streams and environment.
type IO struct {
	Stdin     io.Reader
	Stdout    io.Writer
	Stderr    io.Writer
	LookupEnv func(string) (string, bool)
}

// OS is the real process's IO.
func OS() IO {
	return IO{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, LookupEnv: os.LookupEnv}
}

// UsageError is a command line the command cannot run with (exit 2).
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a *UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{fmt.Errorf(format, args...)}
}

// ExitCode ends the process with the code and no further message: the
// command has already said why (e.g. vet printed the invalid routes).
type ExitCode int

func (e ExitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// Main runs c as the process and exits with its code.
func Main(c *Command) { os.Exit(Execute(c, os.Args[1:], OS())) }

type ioKey struct{}

// Execute runs c with args (without the program name) and returns the
// exit code. SIGINT and SIGTERM are caught before anything else, so a
// process told to stop right after it started still shuts down cleanly.
func Execute(c *Command, args []string, pio IO) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if pio.LookupEnv == nil {
		pio.LookupEnv = func(string) (string, bool) { return "", false }
	}
	root := c.cobra()
	root.SetArgs(args)
	root.SetIn(pio.Stdin)
	root.SetOut(pio.Stdout)
	root.SetErr(pio.Stderr)
	cmd, err := root.ExecuteContextC(context.WithValue(ctx, ioKey{}, pio))
	if err == nil {
		return 0
	}
	var code ExitCode
	if errors.As(err, &code) {
		return int(code)
	}
	var usage *UsageError
	if errors.As(err, &usage) {
		fmt.Fprintf(pio.Stderr, "%s: %v\nUsage: %s\nRun '%s --help' for more.\n", cmd.CommandPath(), err, cmd.UseLine(), cmd.CommandPath())
		return 2
	}
	fmt.Fprintf(pio.Stderr, "%s: %v\n", cmd.CommandPath(), err)
	return 1
}

// versionOf is what --version prints for a root command's Version: the
// stamped VersionString when it is this build's version.
func versionOf(v string) string {
	if v == Version {
		return VersionString()
	}
	return v
}

// cobra builds the cobra command of c and its subcommands.
func (c *Command) cobra() *cobra.Command {
	cc := &cobra.Command{
		Use:                   c.Use,
		Short:                 c.Short,
		Long:                  c.Long,
		Version:               versionOf(c.Version),
		SilenceErrors:         true,
		SilenceUsage:          true,
		DisableFlagsInUseLine: true,
		// A command with subcommands (autoconfig) gets cobra's
		// `completion bash|zsh|fish|powershell`; the sidecars have no
		// commands to complete.
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: len(c.Commands) == 0},
	}
	fs := cc.Flags()
	fs.SortFlags = false
	if c.Options != nil {
		c.Options.AddFlags(fs)
	}
	var logOpts LogOptions
	if c.Log {
		logOpts.AddFlags(fs)
	}
	cc.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &UsageError{err} })
	cc.SetHelpFunc(func(cmd *cobra.Command, _ []string) { printHelp(cmd, cmd.OutOrStdout(), c.EnvName) })
	cc.SetVersionTemplate("{{.Name}} {{.Version}}\n")
	cc.Args = func(cmd *cobra.Command, args []string) error {
		if c.Args != nil {
			if err := c.Args(cmd, args); err != nil {
				return &UsageError{err}
			}
			return nil
		}
		if len(args) == 0 {
			return nil
		}
		if cmd.HasAvailableSubCommands() {
			return Usagef("unknown command %q", args[0])
		}
		return Usagef("unexpected arguments %q", args)
	}
	cc.RunE = func(cmd *cobra.Command, args []string) error {
		pio, _ := cmd.Context().Value(ioKey{}).(IO)
		if c.EnvName != nil {
			if err := ApplyEnv(fs, pio.LookupEnv, c.EnvName); err != nil {
				return &UsageError{err}
			}
		}
		var errs []error
		if c.Options != nil {
			errs = append(errs, c.Options.Validate())
		}
		if c.Log {
			errs = append(errs, logOpts.Validate())
		}
		if err := errors.Join(errs...); err != nil {
			return &UsageError{err}
		}
		if c.Run == nil {
			// A command that only groups subcommands: without one it is
			// a usage error, shown with the command list.
			printHelp(cmd, pio.Stderr, nil)
			return ExitCode(2)
		}
		call := &Call{Args: args, Stdin: pio.Stdin, Stdout: pio.Stdout, Stderr: pio.Stderr}
		if c.Log {
			call.Log = logOpts.Logger(pio.Stderr)
			// Every long-running binary's first line: which build runs.
			call.Log.Info("build", VersionAttrs()...)
		} else {
			call.Log = slog.New(slog.NewTextHandler(pio.Stderr, nil))
		}
		err := c.Run(cmd.Context(), call)
		var usage *UsageError
		var code ExitCode
		if err != nil && c.Log && !errors.As(err, &usage) && !errors.As(err, &code) {
			// A long-running command reports its failure in its own log
			// format.
			call.Log.Error(cmd.Name()+" failed", "error", err)
			return ExitCode(1)
		}
		return err
	}
	for _, sub := range c.Commands {
		cc.AddCommand(sub.cobra())
	}
	return cc
}

// Sidecar is the command of a long-running sidecar binary: its options
// (the zero value of O, filled from flags and PS_ variables named by
// envName), the shared log flags, --version, and run called with the
// validated options and the logger.
func Sidecar[O any, P interface {
	*O
	Options
}](use, long string, envName func(string) string, run func(context.Context, *O, *slog.Logger) error) *Command {
	o := P(new(O))
	return &Command{
		Use:     use,
		Long:    long,
		Options: o,
		EnvName: envName,
		Log:     true,
		Version: Version,
		Run:     func(ctx context.Context, c *Call) error { return run(ctx, (*O)(o), c.Log) },
	}
}
