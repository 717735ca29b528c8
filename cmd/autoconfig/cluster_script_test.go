package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/modelsphere/autoconfig/internal/charttest"
	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/internal/testenv"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// diffUser is the envtest user the cluster scripts run autoconfig as: it
// holds only the chart's read-only <release>-diff ClusterRole.
const diffUser = "autoconfig-diff-user"

// clusterKey is the testscript value holding a script's *scriptCluster.
type clusterKey struct{}

// TestClusterScripts runs testdata/script/cluster/*.txtar against a real
// kube-apiserver: $KUBECONFIG is a user bound to the chart's read-only
// diff ClusterRole and nothing else, so every command the scripts run as
// autoconfig proves that role is enough. The scripts change the cluster
// as an administrator with two commands:
//
//	apply FILE               server-side apply every document of FILE
//	setkey NS/CM KEY FILE    set one key of a ConfigMap to FILE's content
//	                         (what the controller's write would do)
//
// $ADMIN_KUBECONFIG is an administrator's, for a script that runs the
// controller itself (autoconfig controller, in the background).
//
// Isolation is the harness's, not the scripts': every script gets its own
// API server (scripts run in parallel, and `autoconfig diff -A` or a
// controller without --namespace sees the whole cluster), and when a
// script ends the harness checks that everything listable in that cluster
// is the script's own (ownedOnly).
func TestClusterScripts(t *testing.T) {
	role := diffRole(t)
	var (
		mu      sync.Mutex
		servers = map[string]string{} // API server host -> script
	)
	testscript.Run(t, testscript.Params{
		Files:               scriptFiles(t, "../../testdata/script/cluster"),
		RequireExplicitExec: true,
		UpdateScripts:       os.Getenv("AUTOCONFIG_UPDATE") == "1",
		Setup: func(e *testscript.Env) error {
			sc, err := startScriptCluster(role, e.WorkDir)
			if err != nil {
				return err
			}
			// Deferred calls run last first: the check, then the stop.
			e.Defer(sc.stop)
			e.Defer(func() {
				if err := sc.ownedOnly(); err != nil {
					e.T().Log(err)
					e.T().FailNow()
				}
			})
			// Two scripts on one API server would see each other again.
			mu.Lock()
			other, shared := servers[sc.host]
			servers[sc.host] = e.WorkDir
			mu.Unlock()
			if shared {
				return fmt.Errorf("API server %s already serves script %s", sc.host, other)
			}
			e.Values[clusterKey{}] = sc
			e.Setenv("KUBECONFIG", sc.kubeconfig)
			e.Setenv("ADMIN_KUBECONFIG", sc.adminKubeconfig)
			e.Setenv("HOME", e.WorkDir)
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"apply": func(ts *testscript.TestScript, neg bool, args []string) {
				if len(args) != 1 {
					ts.Fatalf("usage: apply FILE")
				}
				sc := ts.Value(clusterKey{}).(*scriptCluster)
				err := sc.apply(ts.ReadFile(args[0]))
				if neg != (err != nil) {
					ts.Fatalf("apply %s: %v", args[0], err)
				}
			},
			"setkey": func(ts *testscript.TestScript, neg bool, args []string) {
				if len(args) != 3 {
					ts.Fatalf("usage: setkey NS/CM KEY FILE")
				}
				sc := ts.Value(clusterKey{}).(*scriptCluster)
				ns, name, _ := strings.Cut(args[0], "/")
				var cm corev1.ConfigMap
				ts.Check(sc.admin.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &cm))
				if cm.Data == nil {
					cm.Data = map[string]string{}
				}
				cm.Data[args[1]] = ts.ReadFile(args[2])
				ts.Check(sc.admin.Update(context.Background(), &cm))
			},
		},
	})
}

// diffRole is the chart's read-only <release>-diff ClusterRole.
func diffRole(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := charttest.Render(charttest.Path(root), "ac", "autoconfig-system", nil)
	if err != nil {
		t.Fatal(err)
	}
	role := rel.Find("ClusterRole", "", "ac-autoconfig-diff")
	if role == nil {
		t.Fatal("the chart renders no ac-autoconfig-diff ClusterRole")
	}
	return role
}

// scriptFiles lists dir's scripts in name order, or in reverse order with
// AUTOCONFIG_SCRIPT_ORDER=reverse (make cluster-scripts runs both, so a
// script that depends on another having run first fails one of them).
func scriptFiles(t *testing.T, dir string) []string {
	files, err := filepath.Glob(filepath.Join(dir, "*.txtar"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts in %s (%v)", dir, err)
	}
	sort.Strings(files)
	switch order := os.Getenv("AUTOCONFIG_SCRIPT_ORDER"); order {
	case "", "name":
	case "reverse":
		slices.Reverse(files)
	default:
		t.Fatalf("AUTOCONFIG_SCRIPT_ORDER=%q: want name or reverse", order)
	}
	return files
}

// scriptCluster is one script's own control plane: the API server, the
// read-only diff user's and an administrator's kubeconfig, and the
// namespaces the script created (what it owns).
type scriptCluster struct {
	env             *envtest.Environment
	host            string
	admin           client.Client
	kubeconfig      string
	adminKubeconfig string

	mu    sync.Mutex
	owned map[string]bool
}

// startScriptCluster starts an API server with the CRD, installs the
// chart's diff ClusterRole bound to diffUser, and writes both users'
// kubeconfigs under dir/.kube.
func startScriptCluster(role *unstructured.Unstructured, dir string) (_ *scriptCluster, err error) {
	env, cfg, stop, err := testenv.StartForMain()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	if err := admin.Create(ctx, role.DeepCopy()); err != nil {
		return nil, fmt.Errorf("create the diff role: %w", err)
	}
	if err := admin.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: diffUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.GetName()},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: diffUser}},
	}); err != nil {
		return nil, fmt.Errorf("bind the diff role: %w", err)
	}
	kdir := filepath.Join(dir, ".kube")
	if err := os.MkdirAll(kdir, 0o700); err != nil {
		return nil, err
	}
	sc := &scriptCluster{env: env, host: cfg.Host, admin: admin, owned: map[string]bool{}}
	user, err := env.AddUser(envtest.User{Name: diffUser}, nil)
	if err != nil {
		return nil, err
	}
	if sc.kubeconfig, err = writeKubeconfig(user, filepath.Join(kdir, "config")); err != nil {
		return nil, err
	}
	// The controller, when a script runs one, is an administrator.
	adminUser, err := env.AddUser(envtest.User{Name: "script-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, err
	}
	if sc.adminKubeconfig, err = writeKubeconfig(adminUser, filepath.Join(kdir, "admin")); err != nil {
		return nil, err
	}
	// The role is read-only: the user cannot write a ConfigMap.
	uc, err := client.New(user.Config(), client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "default"}}
	if err := uc.Create(ctx, probe); !apierrors.IsForbidden(err) {
		return nil, fmt.Errorf("the diff user can create a ConfigMap (err %v): the role is not read-only", err)
	}
	return sc, nil
}

func writeKubeconfig(u *envtest.AuthenticatedUser, path string) (string, error) {
	kc, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, kc, 0o600)
}

func (sc *scriptCluster) stop() {
	if err := sc.env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "cluster script: stop envtest: %v\n", err)
	}
}

// apply server-side applies every YAML document of src as the
// administrator; the namespaces it names become the script's own.
func (sc *scriptCluster) apply(src string) error {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader([]byte(src)), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if len(u.Object) == 0 {
			continue
		}
		sc.mu.Lock()
		if u.GetKind() == "Namespace" {
			sc.owned[u.GetName()] = true
		} else if ns := u.GetNamespace(); ns != "" {
			sc.owned[ns] = true
		}
		sc.mu.Unlock()
		//nolint:staticcheck // client.Apply with unstructured objects is the simple path here
		if err := sc.admin.Patch(context.Background(), &u, client.Apply, client.FieldOwner("cluster-script"), client.ForceOwnership); err != nil {
			return err
		}
	}
}

// ownedOnly fails when the script's cluster holds a namespace or a
// ModelRoute the script did not create: what `diff -A` or a cluster-wide
// controller lists there must be the script's own.
func (sc *scriptCluster) ownedOnly() error {
	ctx := context.Background()
	sc.mu.Lock()
	defer sc.mu.Unlock()
	var foreign []string
	var nss corev1.NamespaceList
	if err := sc.admin.List(ctx, &nss); err != nil {
		return fmt.Errorf("ownership check: list namespaces: %w", err)
	}
	for _, ns := range nss.Items {
		if systemNamespace(ns.Name) || sc.owned[ns.Name] {
			continue
		}
		foreign = append(foreign, "namespace "+ns.Name)
	}
	var routes v1alpha1.ModelRouteList
	if err := sc.admin.List(ctx, &routes); err != nil {
		return fmt.Errorf("ownership check: list modelroutes: %w", err)
	}
	for _, r := range routes.Items {
		if !sc.owned[r.Namespace] {
			foreign = append(foreign, "modelroute "+r.Namespace+"/"+r.Name)
		}
	}
	if len(foreign) > 0 {
		sort.Strings(foreign)
		return fmt.Errorf("the script's API server holds what the script did not create, so its cluster-wide lists are not its own: %s", strings.Join(foreign, ", "))
	}
	return nil
}

func systemNamespace(ns string) bool {
	return ns == "default" || strings.HasPrefix(ns, "kube-")
}

// TestClusterScriptOwnershipCheck: the harness's end-of-script check fails
// when the script's API server holds a namespace or a route the script did
// not apply (what a shared API server would show it), and passes on the
// script's own.
func TestClusterScriptOwnershipCheck(t *testing.T) {
	sc, err := startScriptCluster(diffRole(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.stop)
	if err := sc.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: mine}\n"); err != nil {
		t.Fatal(err)
	}
	if err := sc.ownedOnly(); err != nil {
		t.Fatalf("the script's own namespace is reported: %v", err)
	}
	// Another test's objects, created behind the script's back.
	ctx := context.Background()
	if err := sc.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "theirs"}}); err != nil {
		t.Fatal(err)
	}
	route := &v1alpha1.ModelRoute{ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: "default"}}
	route.Spec.Discovery.Service = "svc"
	route.Spec.Nginx.OutputConfigMap = "routes"
	route.Spec.Nginx.Peers = []v1alpha1.Peer{{Use: "backend"}}
	route.Spec.ModelType = "video"
	if err := sc.admin.Create(ctx, route); err != nil {
		t.Fatal(err)
	}
	err = sc.ownedOnly()
	if err == nil {
		t.Fatal("the check passed with a foreign namespace and route in the script's API server")
	}
	for _, want := range []string{"namespace theirs", "modelroute default/r"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}
