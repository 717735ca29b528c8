package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runHagate runs the built binary with args and a clean environment plus
// env, returning its exit status and combined output.
func runHagate(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(hagateBin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String()
	}
	t.Fatal(err)
	return 0, ""
}

func TestHelp(t *testing.T) {
	code, out := runHagate(t, nil, "--help")
	if code != 0 {
		t.Fatalf("--help exit %d, want 0\n%s", code, out)
	}
	for _, f := range []string{"--name", "--namespace", "--pod-name", "--app-port", "--app-host",
		"--readiness-required-listener port", "--proc-root", "--lease-duration", "--renew-deadline",
		"--retry-period", "--interval", "--kubeconfig", "--metrics-addr", "--health-addr",
		"--log-level", "--log-format", "env PS_APP_PORT_NUMBER", "env PS_POD_NAME", `default "2s"`} {
		if !strings.Contains(out, f) {
			t.Errorf("--help does not mention %q", f)
		}
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	ok := []string{"--name=router", "--namespace=ns", "--pod-name=p", "--app-port=8080"}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no flags", nil, nil, "--name (or PS_NAME) is required"},
		{"unknown flag", nil, []string{"--nope"}, "unknown flag: --nope"},
		{"positional", nil, append(ok, "extra"), "unexpected arguments"},
		{"bad port", nil, []string{"--name=router", "--namespace=ns", "--pod-name=p", "--app-port=70000"}, "--app-port (or PS_APP_PORT_NUMBER) must be 1-65535, got 70000"},
		{"renew not below lease", nil, append(ok, "--lease-duration=2s", "--renew-deadline=2s"), "must be shorter than --lease-duration"},
		{"fractional lease", nil, append(ok, "--lease-duration=2500ms", "--renew-deadline=1s", "--retry-period=0.2s"), "whole seconds"},
		{"bad name", nil, []string{"--name=Router_X", "--namespace=ns", "--pod-name=p", "--app-port=1"}, "Lease name"},
		{"bad listener", nil, append(ok, "--readiness-required-listener=0"), "--readiness-required-listener"},
		{"bad listener env", []string{"PS_READINESS_REQUIRED_LISTENERS=15008,x"}, ok, "PS_READINESS_REQUIRED_LISTENERS"},
		{"bad level", nil, append(ok, "--log-level=loud"), "--log-level"},
		{"bad format", nil, append(ok, "--log-format=xml"), "--log-format"},
		{"bad env duration", []string{"PS_INTERVAL=soon"}, ok, "PS_INTERVAL"},
		{"env is read", []string{"PS_NAME=router", "PS_NAMESPACE=ns", "PS_POD_NAME=p", "PS_APP_PORT_NUMBER=0"}, nil, "got 0"},
		{"flag beats env", []string{"PS_APP_PORT_NUMBER=8080"}, append(ok[:3:3], "--app-port=99999"), "got 99999"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runHagate(t, tc.env, tc.args...)
			if code != 2 {
				t.Fatalf("exit %d, want 2\n%s", code, out)
			}
			if !strings.Contains(out, tc.want) {
				t.Fatalf("output does not contain %q:\n%s", tc.want, out)
			}
		})
	}
}

func TestRuntimeErrorExit1(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-kubeconfig")
	code, out := runHagate(t, nil, "--name=router", "--namespace=ns", "--pod-name=p", "--app-port=8080",
		"--kubeconfig="+missing, "--metrics-addr=", "--health-addr=")
	if code != 1 || !strings.Contains(out, "kubernetes client config") {
		t.Fatalf("exit %d, want 1 with a config error\n%s", code, out)
	}
}
