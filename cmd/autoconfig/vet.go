package main

import (
	"context"
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

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/cli"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/routespec"
	"github.com/modelsphere/autoconfig/schema/yamlscan"
)

func vetCommand() *cli.Command {
	o := &vetOptions{}
	return &cli.Command{
		Use:   "vet [-o text|json|yaml] [--strict-kinds] FILE|DIR|- ...",
		Short: "validate ModelRoute YAML files, directories or stdin (-)",
		Long: `
Validates ModelRoute YAML against the embedded CUE schema: multi-document
files, directories (every *.yaml / *.yml below them) and stdin (-).
Every problem of a document is printed in one run, as
file:line:column: field.path: message (the value of a bad value, the key of
an unknown field or of a struct or list, for a missing field the key of the
field that should hold it). Routes that are valid alone but would write the
same ConfigMap key (the same nginx.route in one ConfigMap, monitor models
Org/M and Org_M, two routes on one CART ConfigMap) are reported too, naming
the other route's file:line, and so is a monitor.outputConfigMap that is
another route's nginx output ConfigMap (bare names resolve with
metadata.namespace where the document sets it; the route's own is a schema
rule).
Documents of other kinds (a Deployment, a Kustomization: any object whose
kind and apiVersion are not the ModelRoute's) are skipped and counted, so a
GitOps directory or "helm template ... | autoconfig vet -" can be checked;
--strict-kinds reports them as problems instead.
The items of a List (kind List, as "kubectl get -o yaml" prints them, or
ModelRouteList) are judged one by one, each at its own line.
Before parsing, a file larger than 4 MiB, with a byte that is not UTF-8, or
nested deeper than 100 levels (a ModelRoute needs fewer than 15) is refused
at its line, and so is a file of more ModelRoute documents than one per 256
bytes (at least 100) or more values in them than one per 4 bytes (at least
20,000; a peer counts as 40), at the document past the limit; a mapping key
that repeats is an error at the repeat, naming the line of the first.
Exit status: 0 all valid, 1 any invalid or conflicting, 2 usage error.

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
	output      string
	strictKinds bool
}

func (o *vetOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVarP(&o.output, "output", "o", "text", "output format: text, json or yaml")
	fs.BoolVar(&o.strictKinds, "strict-kinds", false, "report documents that are not ModelRoutes as problems instead of skipping them")
}

func (o *vetOptions) Validate() error {
	if err := checkOutput(o.output); err != nil {
		return err
	}
	return nil
}

// vetResult is one document's verdict in --output json.
type vetResult struct {
	File  string `json:"file"`
	Line  int    `json:"line"`
	Name  string `json:"name,omitempty"`
	Valid bool   `json:"valid"`
	// Skipped is the "apiVersion kind" of a document that is not a
	// ModelRoute (not validated; Valid unless --strict-kinds).
	Skipped  string           `json:"skipped,omitempty"`
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
	var routes []vetRoute // the valid documents, for the cross-route check
	invalid, skipped := 0, 0
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
			if d.OtherKind != "" {
				r := vetResult{File: d.File, Line: d.Line, Valid: !o.strictKinds, Skipped: d.OtherKind}
				if o.strictKinds {
					p := schema.Problem{File: d.File, Line: d.Line, Path: "kind", Message: fmt.Sprintf("%s is not a ModelRoute (--strict-kinds)", d.OtherKind)}
					r.Problems = []schema.Problem{p}
					invalid++
					if o.output == "text" {
						fmt.Fprintln(stderr, p.String())
					}
				} else {
					skipped++
				}
				results = append(results, r)
				continue
			}
			r := vetResult{File: d.File, Line: d.Line, Valid: d.Err == nil}
			if d.Route != nil {
				r.Name = d.Route.Name
			}
			if d.Err == nil {
				routes = append(routes, vetRoute{result: len(results), doc: d})
			}
			var inv *schema.InvalidError
			var syn *schema.SyntaxError
			switch {
			case d.Err == nil:
			case errors.As(d.Err, &inv):
				r.Problems = inv.Problems
			case errors.As(d.Err, &syn):
				r.Problems = []schema.Problem{{File: syn.File, Line: syn.Line, Column: syn.Column, Message: "parse yaml: " + syn.Message}}
			default:
				// A parse error: its text already starts with file:line.
				msg := strings.TrimPrefix(d.Err.Error(), fmt.Sprintf("%s:%d: ", d.File, d.Line))
				r.Problems = []schema.Problem{{File: d.File, Line: d.Line, Message: msg}}
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
	// Routes that are valid alone may still write one ConfigMap key
	// together: in a cluster they would overwrite each other. A monitor
	// file must not go into an nginx output ConfigMap either.
	conflicts := monitorInNginx(routes)
	for _, vr := range routes {
		if p, ok := canaryOnStable(vr.doc); ok {
			conflicts = append(conflicts, keyConflict{result: vr.result, problem: p})
		}
	}
	for _, c := range append(conflicts, keyConflicts(routes)...) {
		r := &results[c.result]
		if r.Valid {
			r.Valid = false
			invalid++
		}
		r.Problems = append(r.Problems, c.problem)
		if o.output == "text" {
			fmt.Fprintln(stderr, c.problem.String())
		}
	}
	if o.output != "text" {
		if err := printMachine(stdout, o.output, results); err != nil {
			return err
		}
	} else if invalid == 0 {
		fmt.Fprintf(stdout, "%d route(s) valid", len(results)-skipped)
		if skipped > 0 {
			fmt.Fprintf(stdout, "; %d document(s) of other kinds skipped", skipped)
		}
		fmt.Fprintln(stdout)
	}
	if invalid > 0 {
		return cli.ExitCode(1)
	}
	return nil
}

// vetRoute is a valid document and the index of its result.
type vetRoute struct {
	result int
	doc    schema.Document
}

// keyConflict is a problem reported on the result at index result.
type keyConflict struct {
	result  int
	problem schema.Problem
}

// keyConflicts finds routes that would write the same ConfigMap key
// (compiler.OutputKeys: the route file, the CART config.yaml, the monitor
// file). The first route in input order keeps the key; every later one
// gets a problem naming the first and where it is. Two documents of one
// route (same namespace and name) are one object, not a conflict.
func keyConflicts(routes []vetRoute) []keyConflict {
	type writer struct {
		id, file string
		line     int
	}
	first := map[compiler.OwnedKey]writer{}
	var out []keyConflict
	for _, vr := range routes {
		mr := vr.doc.Route
		route := &compiler.Route{Name: mr.Name, Namespace: mr.Namespace, Spec: mr.Spec}
		id := routespec.RefKey(mr.Name, mr.Namespace)
		for _, k := range compiler.OutputKeys(route) {
			at := compiler.OwnedKey{ConfigMap: k.ConfigMap, Key: k.Key}
			w, taken := first[at]
			if !taken {
				first[at] = writer{id, vr.doc.File, vr.doc.Line}
				continue
			}
			if w.id == id {
				continue
			}
			out = append(out, keyConflict{result: vr.result, problem: schema.Problem{
				File: vr.doc.File, Line: vr.doc.Line, Path: k.Field,
				Message: fmt.Sprintf("route %s would write key %s of ConfigMap %s, which route %s (%s:%d) writes too; in a cluster they would overwrite each other: %s",
					id, k.Key, k.ConfigMap, w.id, w.file, w.line, conflictAdvice[k.Field]),
			}})
		}
	}
	return out
}

// monitorInNginx finds routes whose monitor ConfigMap is another route's
// nginx output ConfigMap: openresty includes every *.conf key there, so the
// monitor file would be loaded as nginx configuration. The schema catches a
// route's own nginx ConfigMap (the same text, or a bare name and ns/name
// once metadata.namespace resolves the bare one), so a valid route never
// names its own here. Bare names resolve with metadata.namespace, as the
// controller resolves them in the cluster; a bare name of a route without
// a namespace is not compared: where it lands depends on where the route is
// applied.
func monitorInNginx(routes []vetRoute) []keyConflict {
	type user struct {
		id, file string
		line     int
	}
	nginx := map[string]user{}
	for _, vr := range routes {
		mr := vr.doc.Route
		route := &compiler.Route{Name: mr.Name, Namespace: mr.Namespace, Spec: mr.Spec}
		if cm, ok := compiler.KnownConfigMap(route, mr.Spec.Nginx.OutputConfigMap); ok {
			if _, seen := nginx[cm]; !seen {
				nginx[cm] = user{routespec.RefKey(mr.Name, mr.Namespace), vr.doc.File, vr.doc.Line}
			}
		}
	}
	var out []keyConflict
	for _, vr := range routes {
		mr := vr.doc.Route
		route := &compiler.Route{Name: mr.Name, Namespace: mr.Namespace, Spec: mr.Spec}
		if mr.Spec.Monitor == nil {
			continue
		}
		cm, ok := compiler.KnownConfigMap(route, mr.Spec.Monitor.OutputConfigMap)
		u, clash := nginx[cm]
		if !ok || !clash {
			continue
		}
		out = append(out, keyConflict{result: vr.result, problem: vr.doc.Problem("spec.monitor.outputConfigMap", fmt.Sprintf(
			"monitor.outputConfigMap is ConfigMap %s, the nginx outputConfigMap of route %s (%s:%d): openresty includes every *.conf key there, so the monitor file would be loaded as nginx configuration; write the monitor lines to the monitoring agent's own ConfigMap",
			cm, u.id, u.file, u.line))})
	}
	return out
}

// canaryOnStable reports a route whose canary Service is its stable
// Service once bare names resolve with metadata.namespace (the schema
// catches the same text): both versions would be the same backends.
// `autoconfig vet` and `autoconfig compile` refuse it.
func canaryOnStable(doc schema.Document) (schema.Problem, bool) {
	mr := doc.Route
	if mr == nil || mr.Spec.Canary == nil || mr.Spec.Discovery.Service == "" {
		return schema.Problem{}, false
	}
	stable, canary := mr.Spec.Discovery, mr.Spec.Canary.Discovery
	if !routespec.SameBackends(stable, canary, mr.Namespace) {
		return schema.Problem{}, false
	}
	return doc.Problem("spec.canary.discovery.service", fmt.Sprintf(
		"canary.discovery.service is the Service of spec.discovery (in the route's namespace %s both are Service %s): both versions would be the same backends; point canary.discovery at the canary version's own Service (or, when the same pods serve both versions, give both discoveries their different ports)",
		mr.Namespace, routespec.RefKey(stable.Service, mr.Namespace))), true
}

// conflictAdvice says what to change, by the field that names the key.
var conflictAdvice = map[string]string{
	"spec.nginx.route":          "give one of them another nginx.route or another nginx.outputConfigMap",
	"spec.cart.outputConfigMap": "each model's CART has its own ConfigMap: point one of them at another cart.outputConfigMap",
	"spec.monitor.model":        "give one of them another monitor.model ('/' and '_' make the same key) or another monitor.outputConfigMap",
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

// readInput reads the file name, or stdin for "-" (named "<stdin>"), up
// to one byte past yamlscan.MaxBytes: enough for the schema and the
// snapshot reader to refuse a larger file, at its line, without holding
// all of it.
func readInput(name string, stdin io.Reader) ([]byte, string, error) {
	if name == "-" {
		b, err := readLimited(stdin)
		return b, "<stdin>", err
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, name, err
	}
	defer f.Close()
	b, err := readLimited(f) // an error names the file (*fs.PathError)
	return b, name, err
}

func readLimited(r io.Reader) ([]byte, error) {
	return io.ReadAll(io.LimitReader(r, yamlscan.MaxBytes+1))
}
