package reload

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/modelsphere/autoconfig/internal/reload/reloadtest"
)

func TestSplitCommand(t *testing.T) {
	for in, want := range map[string][]string{
		"nginx -t -q -p /usr/local/openresty/nginx/ -c conf/nginx.conf": {"nginx", "-t", "-q", "-p", "/usr/local/openresty/nginx/", "-c", "conf/nginx.conf"},
		`sh -c 'nginx -t && echo ok'`:                                   {"sh", "-c", "nginx -t && echo ok"},
		`a "b c"d ''`:                                                   {"a", "b cd", ""},
		"  spaced\targs  ":                                              {"spaced", "args"},
	} {
		got, err := SplitCommand(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("SplitCommand(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "   ", `a "b`, "a 'b"} {
		if _, err := SplitCommand(bad); err == nil {
			t.Errorf("SplitCommand(%q) accepted", bad)
		}
	}
}

func TestApplyEnv(t *testing.T) {
	var o Options
	fs := pflag.NewFlagSet("reload", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--process", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"PS_PROCESS":   "from-env", // the command line wins
		"PS_WATCH":     "/a, /b",
		"PS_SOCK_DIR":  "/sock",
		"PS_CHECK_CMD": "nginx -t",
		"PS_DEBOUNCE":  "100ms",
		"PS_SIGNAL":    "SIGUSR1",
	}
	if err := ApplyEnv(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	if o.Process != "from-flag" || !slices.Equal(o.WatchDirs, []string{"/a", "/b"}) || o.SockDir != "/sock" ||
		o.CheckCmd != "nginx -t" || o.Debounce != 100*time.Millisecond {
		t.Fatalf("options %+v", o)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if sig, _ := ParseSignal(o.Signal); sig != syscall.SIGUSR1 {
		t.Fatalf("signal %v", sig)
	}
	if err := ApplyEnv(fs, func(k string) (string, bool) { return "soon", k == "PS_VERIFY_TIMEOUT" }); err == nil || !strings.Contains(err.Error(), "PS_VERIFY_TIMEOUT") {
		t.Fatalf("a bad env value: %v", err)
	}
	if EnvName("check-cmd") != "PS_CHECK_CMD" {
		t.Fatal(EnvName("check-cmd"))
	}
}

func TestValidateTiming(t *testing.T) {
	parse := func(args ...string) error {
		var o Options
		fs := pflag.NewFlagSet("reload", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.AddFlags(fs)
		if err := fs.Parse(append([]string{"--process", "x", "--watch", "/w"}, args...)); err != nil {
			return err
		}
		return o.Validate()
	}
	if err := parse(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if err := parse("--pod-name", "p", "--pod-namespace", "ns", "--kubeconfig", "k"); err != nil {
		t.Fatalf("a served report with a kubeconfig: %v", err)
	}
	for _, c := range []struct{ args []string }{
		{[]string{"--resync", "0s"}},
		{[]string{"--retry-max", "0s"}},
		{[]string{"--debounce", "3s"}},  // beyond the default --max-delay 2s
		{[]string{"--pod-name", "p"}},   // without its namespace
		{[]string{"--kubeconfig", "k"}}, // neither API mode nor a served report
	} {
		if err := parse(c.args...); err == nil {
			t.Errorf("%v accepted", c.args)
		}
	}
}

// TestDocsListEveryFlag keeps docs/reload.md's flag table complete.
func TestDocsListEveryFlag(t *testing.T) {
	doc, err := os.ReadFile("../../docs/reload.md")
	if err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("reload", pflag.ContinueOnError)
	(&Options{}).AddFlags(fs)
	fs.VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(string(doc), "| `--"+f.Name) {
			t.Errorf("docs/reload.md's flag table has no row for --%s", f.Name)
		}
	})
}

// TestCommandLineRoundTrips: the tests give --check-cmd argv through
// reloadtest.CommandLine; SplitCommand must give the same argv back.
func TestCommandLineRoundTrips(t *testing.T) {
	for _, args := range [][]string{
		{"bash", "-c", `[ ! -e "$0" ] || { echo "check: busy"; exit 1; }`, "/tmp/x y"},
		{"sh", "-c", `echo 'quoted' "$@"`, ""},
	} {
		got, err := SplitCommand(reloadtest.CommandLine(args...))
		if err != nil || !slices.Equal(got, args) {
			t.Errorf("SplitCommand(CommandLine(%q)) = %q, %v", args, got, err)
		}
	}
}

// TestNewKeepsTheCallersOptions: New fills the defaults into its own copy
// and leaves the caller's Options as they were; options it cannot run are
// an error.
func TestNewKeepsTheCallersOptions(t *testing.T) {
	dir := t.TempDir()
	o := Options{WatchDirs: []string{dir}, Process: "x", Debounce: 3 * time.Second}
	before := o
	before.WatchDirs = slices.Clone(o.WatchDirs)
	r, err := New(o, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(o, before) {
		t.Fatalf("New changed its argument: %+v, was %+v", o, before)
	}
	if &r.dirs[0] == &o.WatchDirs[0] {
		t.Fatal("the Reloader shares the caller's WatchDirs")
	}
	got := r.opts
	if got.Debounce != 3*time.Second || got.MaxDelay != 3*time.Second || got.VerifyTimeout != DefaultVerifyTimeout ||
		got.CheckTimeout != DefaultCheckTimeout || got.SockSweep != DefaultSockSweep || got.Resync != DefaultResync ||
		got.RetryMax != DefaultRetryMax || got.ProcRoot != "/proc" || r.sig.signal != syscall.SIGHUP || r.sig.check.cmd != nil {
		t.Fatalf("resolved options %+v, signal %v", got, r.sig.signal)
	}
	for _, bad := range []struct {
		o    Options
		want string
	}{
		{Options{WatchDirs: []string{dir}}, "--process is required"},
		{Options{WatchDirs: []string{filepath.Join(dir, "missing")}, Process: "x"}, "not a readable directory"},
		{Options{WatchDirs: []string{dir}, Process: "x", Debounce: time.Second, MaxDelay: time.Millisecond}, "--max-delay"},
		{Options{WatchDirs: []string{dir}, Process: "x", Signal: "KILL"}, "--signal"},
	} {
		if _, err := New(bad.o, nil, nil); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("New(%+v): %v, want an error about %s", bad.o, err, bad.want)
		}
	}
}
