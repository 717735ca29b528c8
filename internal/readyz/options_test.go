package readyz

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/modelsphere/autoconfig/internal/cli"
)

// want is what a parse should produce: the options and the logger's
// level and format.
type want struct {
	Options
	LogLevel  string
	LogFormat string
}

// parseOptions runs the readyz command up to its Run, returning what Run
// was given; ok is false when the command exited before (code).
func parseOptions(args []string, lookup func(string) (string, bool), stdout, stderr io.Writer) (o *Options, log *slog.Logger, code int, ok bool) {
	run := func(_ context.Context, got *Options, l *slog.Logger) error { o, log = got, l; return nil }
	code = cli.Execute(Command(run), args, cli.IO{Stdout: stdout, Stderr: stderr, LookupEnv: lookup})
	return o, log, code, o != nil
}

// logLevel and logFormat read the flags back from the logger.
func logLevel(l *slog.Logger) string {
	for _, lv := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
		if l.Enabled(context.Background(), lv) {
			return strings.ToLower(lv.String())
		}
	}
	return "?"
}

func logFormat(l *slog.Logger) string {
	if _, ok := l.Handler().(*slog.JSONHandler); ok {
		return "json"
	}
	return "text"
}

func run(args []string, lookup func(string) (string, bool), stdout, stderr io.Writer) int {
	return cli.Execute(Command(Run), args, cli.IO{Stdout: stdout, Stderr: stderr, LookupEnv: lookup})
}

func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestParseOptions(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		env    func(string) (string, bool)
		code   int // when ok is false
		ok     bool
		want   want
		stderr string
	}{
		{name: "defaults", ok: true,
			want: want{Options{Listen: ":9404", ProcRoot: "/proc", CacheTTL: time.Second}, "info", "text"}},
		{name: "flags", ok: true,
			args: []string{"--listen", "127.0.0.1:0", "--readiness-required-listener=15008", "--readiness-required-listener", "8080",
				"--proc-root", "/x", "--cache-ttl", "250ms", "--log-level", "debug", "--log-format", "json"},
			want: want{Options{Listen: "127.0.0.1:0", Ports: []int{15008, 8080}, ProcRoot: "/x", CacheTTL: 250 * time.Millisecond}, "debug", "json"}},
		{name: "env", ok: true,
			env:  env("PS_LISTEN", ":1", "PS_READINESS_REQUIRED_LISTENERS", "15008, 8080", "PS_PROC_ROOT", "/y", "PS_CACHE_TTL", "2s", "PS_LOG_LEVEL", "warn", "PS_LOG_FORMAT", "json"),
			want: want{Options{Listen: ":1", Ports: []int{15008, 8080}, ProcRoot: "/y", CacheTTL: 2 * time.Second}, "warn", "json"}},
		{name: "flag wins over env", ok: true,
			args: []string{"--readiness-required-listener=1", "--listen=:2"},
			env:  env("PS_READINESS_REQUIRED_LISTENERS", "15008,8080", "PS_LISTEN", ":1"),
			want: want{Options{Listen: ":2", Ports: []int{1}, ProcRoot: "/proc", CacheTTL: time.Second}, "info", "text"}},
		{name: "bounds accepted", ok: true,
			args: []string{"--readiness-required-listener=1", "--readiness-required-listener=65535"},
			want: want{Options{Listen: ":9404", Ports: []int{1, 65535}, ProcRoot: "/proc", CacheTTL: time.Second}, "info", "text"}},
		{name: "port 0", args: []string{"--readiness-required-listener=0"}, code: 2, stderr: "out of range"},
		{name: "port 65536", args: []string{"--readiness-required-listener=65536"}, code: 2, stderr: "out of range"},
		{name: "duplicate", args: []string{"--readiness-required-listener=15008", "--readiness-required-listener=15008"}, code: 2, stderr: "listed twice"},
		{name: "duplicate in env", env: env("PS_READINESS_REQUIRED_LISTENERS", "15008,15008"), code: 2, stderr: "listed twice"},
		{name: "seventeen", env: env("PS_READINESS_REQUIRED_LISTENERS", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"), code: 2, stderr: "at most 16"},
		{name: "not a number", args: []string{"--readiness-required-listener=http"}, code: 2, stderr: `port "http" is not a number`},
		{name: "bad env names its variable", env: env("PS_CACHE_TTL", "soon"), code: 2, stderr: "PS_CACHE_TTL="},
		{name: "ttl zero", args: []string{"--cache-ttl=0s"}, code: 2, stderr: "--cache-ttl"},
		{name: "ttl too long", args: []string{"--cache-ttl=1h"}, code: 2, stderr: "--cache-ttl"},
		{name: "log format", args: []string{"--log-format=xml"}, code: 2, stderr: "--log-format"},
		{name: "log level", args: []string{"--log-level=loud"}, code: 2, stderr: "--log-level"},
		{name: "unknown flag", args: []string{"--nope"}, code: 2, stderr: "unknown flag: --nope"},
		{name: "extra argument", args: []string{"15008"}, code: 2, stderr: "unexpected arguments"},
		{name: "help", args: []string{"--help"}, code: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lookup := tc.env
			if lookup == nil {
				lookup = env()
			}
			var stdout, stderr bytes.Buffer
			o, log, code, ok := parseOptions(tc.args, lookup, &stdout, &stderr)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v; stderr: %s", ok, tc.ok, stderr.String())
			}
			if !ok {
				if code != tc.code {
					t.Errorf("exit code %d, want %d", code, tc.code)
				}
				if !strings.Contains(stderr.String(), tc.stderr) {
					t.Errorf("stderr %q, want it to contain %q", stderr.String(), tc.stderr)
				}
				return
			}
			if o.Listen != tc.want.Listen || !slices.Equal(o.Ports, tc.want.Ports) || o.ProcRoot != tc.want.ProcRoot ||
				o.CacheTTL != tc.want.CacheTTL || logLevel(log) != tc.want.LogLevel || logFormat(log) != tc.want.LogFormat {
				t.Errorf("got %+v (log %s %s), want %+v", *o, logLevel(log), logFormat(log), tc.want)
			}
		})
	}
}

// TestHelpListsEveryFlag keeps --help accurate: every registered flag and
// its environment variable appear, and help goes to stdout with exit 0.
func TestHelpListsEveryFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--help"}, env(), &stdout, &stderr); code != 0 {
		t.Fatalf("--help exit %d", code)
	}
	help := stdout.String()
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	(&Options{}).AddFlags(fs)
	(&cli.LogOptions{}).AddFlags(fs)
	n := 0
	fs.VisitAll(func(f *pflag.Flag) {
		n++
		for _, s := range []string{"--" + f.Name, EnvName(f.Name)} {
			if !strings.Contains(help, s) {
				t.Errorf("--help does not mention %s", s)
			}
		}
	})
	if n != 6 {
		t.Errorf("%d flags registered; update this test and the docs", n)
	}
	for _, s := range []string{"/readyz", "/health", "/healthz", "/metrics", "missingListeners", "PS_READINESS_REQUIRED_LISTENERS (comma-separated list)"} {
		if !strings.Contains(help, s) {
			t.Errorf("--help does not mention %s", s)
		}
	}
}
