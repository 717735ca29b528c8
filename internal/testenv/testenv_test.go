package testenv_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/internal/testenv"
)

// TestStartInstallsCRDs: the control plane runs, the ModelRoute CRD from
// deploy/crds is Established, and Services get ClusterIPs from
// ServiceCIDR (a /16, not envtest's /24 of 254).
func TestStartInstallsCRDs(t *testing.T) {
	_, cfg := testenv.Start(t)
	s := runtime.NewScheme()
	if err := apiextv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var crd apiextv1.CustomResourceDefinition
	if err := c.Get(ctx, client.ObjectKey{Name: "modelroutes.routing.modelsphere.dev"}, &crd); err != nil {
		t.Fatalf("ModelRoute CRD not installed: %v", err)
	}
	established := false
	for _, cond := range crd.Status.Conditions {
		if cond.Type == apiextv1.Established && cond.Status == apiextv1.ConditionTrue {
			established = true
		}
	}
	if !established {
		t.Errorf("CRD not Established: %+v", crd.Status.Conditions)
	}
	// An address past envtest's /24 is in the range; so is an allocated one.
	for name, ip := range map[string]string{"fixed": "10.0.200.1", "allocated": ""} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.ServiceSpec{ClusterIP: ip, Ports: []corev1.ServicePort{{Port: 80}}}}
		if err := c.Create(ctx, svc); err != nil {
			t.Fatalf("Service with ClusterIP %q: %v", ip, err)
		}
		got, err := netip.ParseAddr(svc.Spec.ClusterIP)
		if err != nil || !netip.MustParsePrefix(testenv.ServiceCIDR).Contains(got) {
			t.Errorf("Service %s: ClusterIP %q, want one in %s", name, svc.Spec.ClusterIP, testenv.ServiceCIDR)
		}
	}
}

// TestMissingBinariesSayWhatToDo: without binaries the error names the
// directory and the command that builds them.
func TestMissingBinariesSayWhatToDo(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("KUBEBUILDER_ASSETS", dir)
	_, err := testenv.AssetsDir()
	if err == nil {
		t.Fatal("AssetsDir succeeded with an empty directory")
	}
	for _, want := range []string{dir, "make envtest", "hack/envtest.sh"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, _, _, err := testenv.StartForMain(); err == nil {
		t.Fatal("StartForMain succeeded without binaries")
	}
}

func TestModuleRoot(t *testing.T) {
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root %q has no go.mod: %v", root, err)
	}
	if _, err := os.Stat(filepath.Join(root, testenv.CRDDir)); err != nil {
		t.Fatalf("module root %q has no %s: %v", root, testenv.CRDDir, err)
	}
}
