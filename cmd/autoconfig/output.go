package main

import (
	"encoding/json"
	"fmt"
	"io"

	"sigs.k8s.io/yaml"
)

// outputFormats are the values of -o/--output in every command that
// prints results: text for people, json and yaml (the same fields) for
// machines.
var outputFormats = []string{"text", "json", "yaml"}

// checkOutput is the -o check every command shares.
func checkOutput(format string) error {
	for _, f := range outputFormats {
		if f == format {
			return nil
		}
	}
	return fmt.Errorf("-o/--output must be text, json or yaml, not %q", format)
}

// printMachine writes v as JSON (indented) or YAML, by its json tags.
func printMachine(w io.Writer, format string, v any) error {
	if format == "yaml" {
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
