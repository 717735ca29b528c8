package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
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
	"github.com/modelsphere/autoconfig/internal/testenv"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// diffUser is the envtest user the cluster scripts run autoconfig as: it
// holds only the chart's read-only <release>-diff ClusterRole.
const diffUser = "autoconfig-diff-user"

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
func TestClusterScripts(t *testing.T) {
	env, cfg := testenv.Start(t)
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	root, err := testenv.ModuleRoot()
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
	if err := admin.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	if err := admin.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: diffUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.GetName()},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: diffUser}},
	}); err != nil {
		t.Fatal(err)
	}
	user, err := env.AddUser(envtest.User{Name: diffUser}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	// The controller, when a script runs one, is an administrator.
	adminUser, err := env.AddUser(envtest.User{Name: "script-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	akc, err := adminUser.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	adminKubeconfig := filepath.Join(t.TempDir(), "admin-kubeconfig")
	if err := os.WriteFile(adminKubeconfig, akc, 0o600); err != nil {
		t.Fatal(err)
	}
	// The role is read-only: the user cannot write a ConfigMap.
	uc, err := client.New(user.Config(), client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "default"}}
	if err := uc.Create(ctx, probe); !apierrors.IsForbidden(err) {
		t.Fatalf("the diff user can create a ConfigMap (err %v): the role is not read-only", err)
	}

	testscript.Run(t, testscript.Params{
		Dir:                 "../../testdata/script/cluster",
		RequireExplicitExec: true,
		UpdateScripts:       os.Getenv("AUTOCONFIG_UPDATE") == "1",
		Setup: func(e *testscript.Env) error {
			e.Setenv("KUBECONFIG", kubeconfig)
			e.Setenv("ADMIN_KUBECONFIG", adminKubeconfig)
			e.Setenv("HOME", e.WorkDir)
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"apply": func(ts *testscript.TestScript, neg bool, args []string) {
				if len(args) != 1 {
					ts.Fatalf("usage: apply FILE")
				}
				err := applyFile(ctx, admin, ts.ReadFile(args[0]))
				if neg != (err != nil) {
					ts.Fatalf("apply %s: %v", args[0], err)
				}
			},
			"setkey": func(ts *testscript.TestScript, neg bool, args []string) {
				if len(args) != 3 {
					ts.Fatalf("usage: setkey NS/CM KEY FILE")
				}
				ns, name, _ := strings.Cut(args[0], "/")
				var cm corev1.ConfigMap
				ts.Check(admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cm))
				if cm.Data == nil {
					cm.Data = map[string]string{}
				}
				cm.Data[args[1]] = ts.ReadFile(args[2])
				ts.Check(admin.Update(ctx, &cm))
			},
		},
	})
}

// applyFile server-side applies every YAML document of src as the
// administrator.
func applyFile(ctx context.Context, c client.Client, src string) error {
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
		//nolint:staticcheck // client.Apply with unstructured objects is the simple path here
		if err := c.Patch(ctx, &u, client.Apply, client.FieldOwner("cluster-script"), client.ForceOwnership); err != nil {
			return err
		}
	}
}
