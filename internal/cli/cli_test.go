package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

type testOptions struct {
	Name  string
	Ports []int
}

func (o *testOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Name, "name", "", "the `name`")
	fs.Var(PortList{Ports: &o.Ports}, "port", "a port; repeatable")
}

func (o *testOptions) Validate() error {
	if o.Name == "" {
		return errors.New("--name is required")
	}
	return nil
}

// execute runs a sidecar-shaped command whose Run returns runErr.
func execute(t *testing.T, env map[string]string, runErr error, args ...string) (code int, o *testOptions, stdout, stderr string) {
	t.Helper()
	o = &testOptions{}
	c := &Command{
		Use:     "side [flags]",
		Long:    "side does things.",
		Options: o,
		EnvName: func(f string) string { return EnvName(f, map[string]string{"port": "PS_PORTS"}) },
		Log:     true,
		Version: "1.2.3",
		Run: func(_ context.Context, c *Call) error {
			c.Log.Debug("debug line")
			return runErr
		},
	}
	var out, errb bytes.Buffer
	code = Execute(c, args, IO{Stdout: &out, Stderr: &errb, LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
	return code, o, out.String(), errb.String()
}

func TestExecuteExitCodesAndEnv(t *testing.T) {
	if code, o, _, errb := execute(t, map[string]string{"PS_NAME": "env", "PS_PORTS": "1,2", "PS_LOG_LEVEL": "debug"}, nil, "--port=3"); code != 0 ||
		o.Name != "env" || len(o.Ports) != 1 || !strings.Contains(errb, "debug line") {
		t.Fatalf("env: exit %d, options %+v (the flag must win over PS_PORTS), stderr %q", code, o, errb)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		err  error
		args []string
		code int
		want string
	}{
		{"usage: validate", nil, nil, nil, 2, "side: --name is required\nUsage: side [flags]\n"},
		{"usage: unknown flag", nil, nil, []string{"--nope"}, 2, "unknown flag: --nope"},
		{"usage: positional", nil, nil, []string{"--name=x", "extra"}, 2, `unexpected arguments ["extra"]`},
		{"usage: bad env", map[string]string{"PS_PORTS": "x"}, nil, []string{"--name=x"}, 2, `PS_PORTS="x": port "x" is not a number`},
		{"usage: log level", nil, nil, []string{"--name=x", "--log-level=loud"}, 2, "--log-level"},
		{"usage: from Run", nil, Usagef("bad combination"), []string{"--name=x"}, 2, "bad combination"},
		{"runtime", nil, errors.New("boom"), []string{"--name=x", "--log-format=json"}, 1, `"msg":"side failed","error":"boom"`},
		{"exit code", nil, ExitCode(3), []string{"--name=x"}, 3, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, _, errb := execute(t, tc.env, tc.err, tc.args...)
			if code != tc.code || !strings.Contains(errb, tc.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, errb, tc.code, tc.want)
			}
		})
	}
}

func TestHelpAndVersion(t *testing.T) {
	code, _, out, errb := execute(t, nil, nil, "--help")
	if code != 0 || errb != "" {
		t.Fatalf("--help: exit %d, stderr %q", code, errb)
	}
	for _, s := range []string{"Usage: side [flags]", "side does things.", "--name name\n", "env PS_NAME\n",
		"--port port\n", "env PS_PORTS (comma-separated list)", "--log-level level", `env PS_LOG_LEVEL, default "info"`, "--version"} {
		if !strings.Contains(out, s) {
			t.Errorf("--help lacks %q:\n%s", s, out)
		}
	}
	if code, _, out, _ := execute(t, nil, nil, "--version"); code != 0 || out != "side 1.2.3\n" {
		t.Fatalf("--version: exit %d, %q", code, out)
	}
}

func TestSubcommands(t *testing.T) {
	ran := ""
	root := &Command{Use: "tool <command>", Long: "tool does things.", Commands: []*Command{
		{Use: "a FILE...", Short: "the a command", Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("name a FILE")
			}
			return nil
		}, Run: func(_ context.Context, c *Call) error { ran = "a " + strings.Join(c.Args, " "); return nil }},
	}}
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		return Execute(root, args, IO{Stdout: &out, Stderr: &errb}), out.String(), errb.String()
	}
	if code, _, _ := run("a", "x", "y"); code != 0 || ran != "a x y" {
		t.Fatalf("a: exit %d, ran %q", code, ran)
	}
	if code, _, errb := run(); code != 2 || !strings.Contains(errb, "the a command") {
		t.Fatalf("no command: exit %d, stderr %q; want 2 and the command list", code, errb)
	}
	if code, _, errb := run("nosuch"); code != 2 || !strings.Contains(errb, `unknown command "nosuch"`) {
		t.Fatalf("nosuch: exit %d, stderr %q", code, errb)
	}
	if code, _, errb := run("a"); code != 2 || !strings.Contains(errb, "tool a: name a FILE\nUsage: tool a FILE...") {
		t.Fatalf("a without args: exit %d, stderr %q", code, errb)
	}
	if code, out, _ := run("help"); code != 0 || !strings.Contains(out, "  a           the a command") {
		t.Fatalf("help: exit %d, stdout %q", code, out)
	}
	// Shell completion: the script, and what it asks the binary for.
	if code, out, _ := run("completion", "bash"); code != 0 || !strings.Contains(out, "__start_tool") {
		t.Fatalf("completion bash: exit %d, stdout %.200q", code, out)
	}
	if code, out, _ := run("__complete", ""); code != 0 || !strings.Contains(out, "a\tthe a command") {
		t.Fatalf("__complete: exit %d, stdout %q", code, out)
	}
}

func TestVersionStamp(t *testing.T) {
	c, d := Commit, BuildDate
	defer func() { Commit, BuildDate = c, d }()
	Commit, BuildDate = "", ""
	if s := VersionString(); !strings.Contains(s, "unstamped build") || !strings.HasPrefix(s, Version+" ") {
		t.Errorf("unstamped: %q", s)
	}
	Commit, BuildDate = "1a2b3c4", "2026-12-02T08:00:00Z"
	if s := VersionString(); s != Version+" (commit 1a2b3c4, built 2026-12-02T08:00:00Z)" {
		t.Errorf("stamped: %q", s)
	}
	// A long-running command's first log line names the build.
	_, _, _, errb := execute(t, nil, nil, "--name=x")
	if !strings.Contains(errb, "msg=build version="+Version+" commit=1a2b3c4 buildDate=2026-12-02T08:00:00Z") {
		t.Errorf("no build line in %q", errb)
	}
}
