package kubeclient

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// kubeconfig writes a kubeconfig with one context per server, named after
// it ("a" → https://a.example:6443), the first one current; a context
// named "<n>-ns" sets namespace n.
func kubeconfig(t *testing.T, dir string, contexts ...string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Config\ncurrent-context: " + contexts[0] + "\nclusters:\n")
	for _, c := range contexts {
		b.WriteString("- name: " + c + "\n  cluster: {server: https://" + c + ".example:6443}\n")
	}
	b.WriteString("users: [{name: u, user: {token: t}}]\ncontexts:\n")
	for _, c := range contexts {
		ns := ""
		if n, ok := strings.CutSuffix(c, "-ns"); ok {
			ns = ", namespace: " + n
		}
		b.WriteString("- name: " + c + "\n  context: {cluster: " + c + ", user: u" + ns + "}\n")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "config")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// isolate points $HOME at an empty directory and clears $KUBECONFIG and
// the in-cluster variables, so only what a test writes is found.
func isolate(t *testing.T) (home string) {
	home = t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	return home
}

func TestLoad(t *testing.T) {
	home := isolate(t)
	explicit := kubeconfig(t, t.TempDir(), "explicit", "team-ns")
	env := kubeconfig(t, t.TempDir(), "env")
	kubeconfig(t, filepath.Join(home, ".kube"), "home")

	for _, c := range []struct {
		name, kubeconfig, context, env string
		host, ns                       string
	}{
		{"~/.kube/config", "", "", "", "https://home.example:6443", "default"},
		{"$KUBECONFIG over ~/.kube/config", "", "", env, "https://env.example:6443", "default"},
		{"--kubeconfig over $KUBECONFIG", explicit, "", env, "https://explicit.example:6443", "default"},
		{"--context", explicit, "team-ns", env, "https://team-ns.example:6443", "team"},
		{"--context in $KUBECONFIG", "", "env", env, "https://env.example:6443", "default"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", c.env)
			cfg, ns, err := Load(c.kubeconfig, c.context)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != c.host || ns != c.ns || cfg.BearerToken != "t" {
				t.Fatalf("host %q namespace %q token %q, want %q %q t", cfg.Host, ns, cfg.BearerToken, c.host, c.ns)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	home := isolate(t)
	explicit := kubeconfig(t, t.TempDir(), "a", "b")
	missing := filepath.Join(t.TempDir(), "missing")
	for _, c := range []struct {
		name, kubeconfig, context string
		home                      bool // write ~/.kube/config first
		want                      []string
	}{
		{"unknown context", explicit, "c", false, []string{`context "c" not found`, "--kubeconfig " + explicit, "contexts: a, b"}},
		{"unknown context in ~/.kube/config", "", "c", true, []string{`context "c" not found`, filepath.Join(home, ".kube", "config"), "contexts: home"}},
		{"a context but no kubeconfig", "", "c", false, []string{`context "c" not found`, "no contexts"}},
		{"missing --kubeconfig", missing, "", false, []string{"--kubeconfig " + missing, "no such file"}},
		{"nothing at all", "", "", false, []string{"no kubeconfig", "$KUBECONFIG", "not in a cluster", "KUBERNETES_SERVICE_HOST"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			os.RemoveAll(filepath.Join(home, ".kube"))
			if c.home {
				kubeconfig(t, filepath.Join(home, ".kube"), "home")
			}
			_, _, err := Load(c.kubeconfig, c.context)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
