package cli

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestApplyEnvFlagWinsAndErrorsNameTheVariable(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	var ports []int
	a := fs.String("alpha", "def", "")
	b := fs.String("beta", "def", "")
	fs.Var(PortList{Ports: &ports}, "port", "")
	if err := fs.Parse([]string{"--alpha=cli"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"PS_ALPHA": "env", "PS_BETA": "env", "PS_PORTS": "1, 2,3"}
	name := func(f string) string { return EnvName(f, map[string]string{"port": "PS_PORTS"}) }
	if err := ApplyEnv(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, name); err != nil {
		t.Fatal(err)
	}
	if got := (PortList{Ports: &ports}).String(); *a != "cli" || *b != "env" || got != "1,2,3" {
		t.Fatalf("alpha %q beta %q ports %v", *a, *b, ports)
	}

	fs2 := pflag.NewFlagSet("y", pflag.ContinueOnError)
	fs2.Var(PortList{Ports: &ports}, "port", "")
	env["PS_PORTS"] = "15008,x"
	err := ApplyEnv(fs2, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, name)
	if err == nil || !strings.Contains(err.Error(), `PS_PORTS="15008,x": port "x" is not a number`) {
		t.Fatalf("want the variable named in the error, got %v", err)
	}
}

func TestLogOptions(t *testing.T) {
	for _, l := range []string{"debug", "info", "warn", "error", "INFO"} {
		if _, err := ParseLogLevel(l); err != nil {
			t.Errorf("%s: %v", l, err)
		}
	}
	if _, err := ParseLogLevel("loud"); err == nil {
		t.Error("loud accepted")
	}
	if (&LogOptions{Level: "info", Format: "json"}).Validate() != nil || (&LogOptions{Level: "info", Format: "xml"}).Validate() == nil {
		t.Error("log format validation wrong")
	}
	var b strings.Builder
	o := &LogOptions{Level: "warn", Format: "json"}
	o.Logger(&b).Info("hidden")
	o.Logger(&b).Warn("shown")
	if strings.Contains(b.String(), "hidden") || !strings.Contains(b.String(), `"msg":"shown"`) {
		t.Fatalf("logger output %q", b.String())
	}
	// logr's V(1) and V(2) (slog levels -1, -2) read DEBUG, not DEBUG+3.
	for _, format := range []string{"json", "text"} {
		var d strings.Builder
		l := (&LogOptions{Level: "debug", Format: format}).Logger(&d)
		l.Log(context.Background(), slog.Level(-1), "v1")
		l.Log(context.Background(), slog.Level(-2), "v2")
		l.Warn("w")
		out := d.String()
		if strings.Contains(out, "DEBUG+") || strings.Count(out, "DEBUG") != 2 || !strings.Contains(out, "WARN") {
			t.Errorf("%s levels: %q", format, out)
		}
	}
}
