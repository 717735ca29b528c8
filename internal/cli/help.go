package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// printHelp writes the help of cmd: synopsis, description, subcommands and
// flags, each flag with its default and (envName set) its environment
// variable.
func printHelp(cmd *cobra.Command, w io.Writer, envName func(string) string) {
	fmt.Fprintf(w, "Usage: %s\n", cmd.UseLine())
	if text := strings.TrimSpace(cmd.Long); text != "" {
		fmt.Fprintf(w, "\n%s\n", text)
	} else if cmd.Short != "" {
		fmt.Fprintf(w, "\n%s\n", cmd.Short)
	}
	if cmd.HasAvailableSubCommands() {
		fmt.Fprintln(w, "\nCommands:")
		for _, sub := range cmd.Commands() {
			if sub.IsAvailableCommand() || sub.Name() == "help" {
				fmt.Fprintf(w, "  %-11s %s\n", sub.Name(), sub.Short)
			}
		}
	}
	if cmd.HasAvailableFlags() {
		fmt.Fprintln(w, "\nFlags:")
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			if !f.Hidden {
				printFlag(w, f, envName)
			}
		})
	}
	if cmd.HasAvailableSubCommands() {
		fmt.Fprintf(w, "\nRun '%s <command> --help' for a command's flags.\n", cmd.CommandPath())
	}
}

func printFlag(w io.Writer, f *pflag.Flag, envName func(string) string) {
	typ, usage := pflag.UnquoteUsage(f)
	line := "  --" + f.Name
	if f.Shorthand != "" {
		line = "  -" + f.Shorthand + ", --" + f.Name
	}
	if typ != "" && typ != "bool" {
		line += " " + typ
	}
	fmt.Fprintf(w, "%s\n      %s\n", line, usage)
	var notes []string
	if envName != nil && !builtin(f.Name) {
		env := "env " + envName(f.Name)
		if _, ok := f.Value.(listValue); ok {
			env += " (comma-separated list)"
		}
		notes = append(notes, env)
	}
	switch f.DefValue {
	case "", "0", "false", "[]":
	default:
		notes = append(notes, fmt.Sprintf("default %q", f.DefValue))
	}
	if len(notes) > 0 {
		fmt.Fprintf(w, "      %s\n", strings.Join(notes, ", "))
	}
}
