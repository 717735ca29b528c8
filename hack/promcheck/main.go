// Command promcheck checks Prometheus rules and dashboard queries with
// Prometheus' own parsers (model/rulefmt, promql/parser) and prints the
// metric names they read, one per line, sorted. It is its own module, so
// the controller's go.mod does not take on Prometheus' dependencies; the
// chart's tests run it (internal/charttest).
//
//	go -C hack/promcheck run . -rules GROUPS.yaml -exprs EXPRS.txt
//
// GROUPS.yaml is a Prometheus rule file (the spec of a PrometheusRule);
// EXPRS.txt has one PromQL expression per line (a dashboard's targets).
// Exit status: 0 all valid, 1 a rule or expression is invalid, 2 usage.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("promcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rules := fs.String("rules", "", "Prometheus rule file (groups:) to check")
	exprs := fs.String("exprs", "", "file of PromQL expressions, one per line, to check")
	if err := fs.Parse(args); err != nil || (*rules == "" && *exprs == "") {
		fmt.Fprintln(stderr, "usage: promcheck [-rules FILE] [-exprs FILE]")
		return 2
	}
	p := parser.NewParser(parser.Options{})
	names := map[string]bool{}
	bad := false
	collect := func(where, expr string) {
		e, err := p.ParseExpr(expr)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", where, err)
			bad = true
			return
		}
		parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok && vs.Name != "" {
				names[vs.Name] = true
			}
			return nil
		})
	}
	if *rules != "" {
		groups, errs := rulefmt.ParseFile(*rules, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
		for _, err := range errs {
			fmt.Fprintf(stderr, "%s: %v\n", *rules, err)
			bad = true
		}
		if groups != nil {
			for _, g := range groups.Groups {
				for _, r := range g.Rules {
					collect(fmt.Sprintf("%s: group %s rule %s%s", *rules, g.Name, r.Alert, r.Record), r.Expr)
				}
			}
		}
	}
	if *exprs != "" {
		f, err := os.Open(*exprs)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for line := 1; sc.Scan(); line++ {
			if e := strings.TrimSpace(sc.Text()); e != "" {
				collect(fmt.Sprintf("%s:%d", *exprs, line), e)
			}
		}
		if err := sc.Err(); err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
	}
	for _, n := range slices.Sorted(func(yield func(string) bool) {
		for n := range names {
			if !yield(n) {
				return
			}
		}
	}) {
		fmt.Fprintln(stdout, n)
	}
	if bad {
		return 1
	}
	return 0
}
