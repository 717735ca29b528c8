package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/schema"
)

func vetCommand() *cli.Command {
	o := &vetOptions{}
	return &cli.Command{
		Use:   "vet [--output text|json] FILE|DIR|- ...",
		Short: "validate ModelRoute YAML files, directories or stdin (-)",
		Long: `
Validates ModelRoute YAML against the embedded CUE schema: multi-document
files, directories (every *.yaml / *.yml below them) and stdin (-).
Each problem is printed as file:line: field.path: message.
Exit status: 0 all valid, 1 any invalid, 2 usage error.

The same verdict without this binary:
  cue vet -c ./schema/ route.yaml -d '#ModelRoute'
`,
		Options: o,
		Args:    cobra.ArbitraryArgs,
		Run: func(_ context.Context, c *cli.Call) error {
			return runVet(o, c.Args, c.Stdin, c.Stdout, c.Stderr)
		},
	}
}

// vetOptions are the flags of `autoconfig vet`.
type vetOptions struct {
	output string
}

func (o *vetOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.output, "output", "text", "output format: text or json")
}

func (o *vetOptions) Validate() error {
	if o.output != "text" && o.output != "json" {
		return fmt.Errorf("--output must be text or json, not %q", o.output)
	}
	return nil
}

// vetResult is one document's verdict in --output json.
type vetResult struct {
	File     string           `json:"file"`
	Line     int              `json:"line"`
	Name     string           `json:"name,omitempty"`
	Valid    bool             `json:"valid"`
	Problems []schema.Problem `json:"problems,omitempty"`
}

// runVet validates the inputs named by args; every invalid document is
// reported and the result is exit status 1.
func runVet(o *vetOptions, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return cli.Usagef("name at least one FILE, DIR or - (stdin)")
	}
	files, err := expandInputs(args)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	v, err := schema.Default()
	if err != nil {
		return err
	}
	var results []vetResult
	invalid := 0
	for _, f := range files {
		src, name, err := readInput(f, stdin)
		if err != nil {
			return &cli.UsageError{Err: err}
		}
		docs := v.ValidateStream(name, src)
		if len(docs) == 0 {
			fmt.Fprintf(stderr, "%s: no ModelRoute documents found\n", name)
			invalid++
			results = append(results, vetResult{File: name, Problems: []schema.Problem{{File: name, Message: "no ModelRoute documents found"}}})
			continue
		}
		for _, d := range docs {
			r := vetResult{File: d.File, Line: d.Line, Valid: d.Err == nil}
			if d.Route != nil {
				r.Name = d.Route.Name
			}
			var inv *schema.InvalidError
			switch {
			case d.Err == nil:
			case errors.As(d.Err, &inv):
				r.Problems = inv.Problems
			default:
				r.Problems = []schema.Problem{{File: d.File, Line: d.Line, Message: d.Err.Error()}}
			}
			if !r.Valid {
				invalid++
				if o.output == "text" {
					for _, p := range r.Problems {
						fmt.Fprintln(stderr, p.String())
					}
				}
			}
			results = append(results, r)
		}
	}
	if o.output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(results); err != nil {
			return err
		}
	} else if invalid == 0 {
		fmt.Fprintf(stdout, "%d route(s) valid\n", len(results))
	}
	if invalid > 0 {
		return cli.ExitCode(1)
	}
	return nil
}

// expandInputs turns the arguments into a file list: directories are walked
// for *.yaml and *.yml in lexical order; "-" is stdin.
func expandInputs(args []string) ([]string, error) {
	var out []string
	for _, a := range args {
		if a == "-" {
			out = append(out, a)
			continue
		}
		st, err := os.Stat(a)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			out = append(out, a)
			continue
		}
		var found []string
		err = filepath.WalkDir(a, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
				found = append(found, p)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("%s: no *.yaml or *.yml files", a)
		}
		sort.Strings(found)
		out = append(out, found...)
	}
	return out, nil
}

func readInput(name string, stdin io.Reader) ([]byte, string, error) {
	if name == "-" {
		b, err := io.ReadAll(stdin)
		return b, "<stdin>", err
	}
	b, err := os.ReadFile(name)
	return b, name, err
}
