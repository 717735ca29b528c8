package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/internal/testenv"
)

const (
	apiNamespace = "routing"
	apiConfigMap = "openresty-routes"
	apiUser      = "reload-sidecar"
)

// envtestAssets is the directory of the envtest binaries (internal/testenv
// finds it); missing binaries fail the test with how to build them. The
// ModelRoute CRD is not needed here, so testenv.Start is not used.
func envtestAssets(t testing.TB) string {
	dir, err := testenv.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// apiEnv is a real apiserver with the ConfigMap and a user that may only
// get/list/watch that one ConfigMap, as docs/reload.md prescribes.
type apiEnv struct {
	admin      kubernetes.Interface
	kubeconfig string
}

func startAPI(t testing.TB, data map[string]string) *apiEnv {
	t.Helper()
	env := &envtest.Environment{BinaryAssetsDirectory: envtestAssets(t)}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	admin := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: apiNamespace}}, metav1.CreateOptions{}))
	must(admin.CoreV1().ConfigMaps(apiNamespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: apiConfigMap}, Data: data}, metav1.CreateOptions{}))
	must(admin.CoreV1().ConfigMaps(apiNamespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "secret-ish"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}))
	must(admin.RbacV1().Roles(apiNamespace).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: apiUser},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{""}, Resources: []string{"configmaps"},
			ResourceNames: []string{apiConfigMap}, Verbs: []string{"get", "list", "watch"},
		}},
	}, metav1.CreateOptions{}))
	must(admin.RbacV1().RoleBindings(apiNamespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: apiUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: apiUser},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: apiUser}},
	}, metav1.CreateOptions{}))

	user, err := env.AddUser(envtest.User{Name: apiUser}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	a := &apiEnv{admin: admin, kubeconfig: filepath.Join(t.TempDir(), "kubeconfig")}
	if err := os.WriteFile(a.kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	// The user's rights are exactly the one ConfigMap.
	uc := kubernetes.NewForConfigOrDie(user.Config())
	if _, err := uc.CoreV1().ConfigMaps(apiNamespace).Get(ctx, "secret-ish", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the restricted user can read another ConfigMap: %v", err)
	}
	if _, err := uc.CoreV1().ConfigMaps(apiNamespace).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the restricted user can list all ConfigMaps: %v", err)
	}
	return a
}

func (a *apiEnv) update(t testing.TB, data map[string]string) {
	t.Helper()
	ctx := context.Background()
	cm, err := a.admin.CoreV1().ConfigMaps(apiNamespace).Get(ctx, apiConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data = data
	if _, err := a.admin.CoreV1().ConfigMaps(apiNamespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// startAPIMode runs nginx on an empty write dir and the sidecar in API
// mode as the restricted user.
func startAPIMode(t testing.TB, routes func(n *nginxtest.Nginx) map[string]string, extra ...string) (*apiEnv, *nginxtest.Nginx, *sidecar, string) {
	t.Helper()
	dir := t.TempDir()
	n := nginxtest.Start(t, nginxtest.Options{RoutesDir: dir})
	a := startAPI(t, routes(n))
	args := append([]string{
		"--configmap", apiNamespace + "/" + apiConfigMap, "--write-dir", dir, "--kubeconfig", a.kubeconfig,
		"--process", n.MasterMatch(), "--sock-dir", n.SockDir(), "--check-cmd", checkCmd(n),
	}, extra...)
	s := startSidecar(t, args...)
	return a, n, s, dir
}

func TestAPIMode(t *testing.T) {
	a, n, s, dir := startAPIMode(t, func(n *nginxtest.Nginx) map[string]string {
		return map[string]string{routeFile("a"): routeConf(n, "a", "a1")}
	})
	// The initial sync writes the keys and reloads nginx.
	s.waitCount(t, 1, "result=success")
	waitServes(t, n, "a", "a1")
	if code := s.get(t, "/readyz"); code != 200 {
		t.Fatalf("/readyz %d after the first sync, want 200", code)
	}
	base := hups(n)

	// Update: a changed, b added → files in kubelet's layout → one HUP.
	a.update(t, map[string]string{routeFile("a"): routeConf(n, "a", "a2"), routeFile("b"): routeConf(n, "b", "b1")})
	waitServes(t, n, "b", "b1")
	waitServes(t, n, "a", "a2")
	s.waitCount(t, 2, "result=success")
	if h := hups(n) - base; h != 1 {
		t.Fatalf("%d SIGHUPs for one ConfigMap update, want 1", h)
	}
	b, err := os.ReadFile(filepath.Join(dir, routeFile("b")))
	if err != nil || string(b) != routeConf(n, "b", "b1") {
		t.Fatalf("written b: %q, %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(dir, routeFile("b"))); err != nil || l != "..data/"+routeFile("b") {
		t.Fatalf("b is not a ..data link: %q, %v", l, err)
	}

	// Key a removed: its file goes, nginx drops the route.
	a.update(t, map[string]string{routeFile("b"): routeConf(n, "b", "b1")})
	s.waitCount(t, 3, "result=success")
	testbin.WaitFor(t, wait, "route a to go", func() bool {
		code, _ := nginxtest.Get(t, n.URL("a"))
		return code == 502
	})
	if _, err := os.Lstat(filepath.Join(dir, routeFile("a"))); err == nil {
		t.Fatal("the file of a removed key is still there")
	}

	// A broken update: b's new version fails the check, so it is
	// quarantined: its last good version stays on disk and keeps serving.
	a.update(t, map[string]string{routeFile("b"): brokenRoute(n, "b")})
	s.waitCount(t, 1, "quarantined:", "key="+routeFile("b"), "no_such_directive")
	wantServes(t, n, "b", "b1")
	if got, err := os.ReadFile(filepath.Join(dir, routeFile("b"))); err != nil || string(got) != routeConf(n, "b", "b1") {
		t.Fatalf("quarantined b on disk: %q, %v; want its last good version", got, err)
	}
	if v := s.metric(t, `autoconfig_reload_quarantined_keys`); v != 1 {
		t.Fatalf("quarantined_keys %v, want 1", v)
	}

	// Deleting the ConfigMap keeps the last content.
	if err := a.admin.CoreV1().ConfigMaps(apiNamespace).Delete(context.Background(), apiConfigMap, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitCount(t, 1, "configmap deleted; keeping the last written content")
	if _, err := os.Stat(filepath.Join(dir, routeFile("b"))); err != nil {
		t.Fatalf("content removed after the ConfigMap was deleted: %v", err)
	}
	if strings.Contains(s.log.String(), "forbidden") {
		t.Fatalf("the sidecar hit an RBAC denial:\n%s", s.log.String())
	}
	// initial, update, removal, and for the broken update the trial and
	// the return to the last good version.
	if v := s.metric(t, `autoconfig_reload_configmap_writes_total{result="written"}`); v != 5 {
		t.Fatalf("configmap writes %v, want 5", v)
	}
}
