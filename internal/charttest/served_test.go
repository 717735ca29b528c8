package charttest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/modelsphere/autoconfig/internal/reload"
	"github.com/modelsphere/autoconfig/internal/served"
)

// TestServedReportOnlyByThePodItself: the chart's ValidatingAdmissionPolicy
// on the real API server. A consumer pod's service account may patch pods
// (its reload sidecar records what it serves on its own Pod, its hagate
// sidecar fences labels on other pods), yet with a token bound to pod a it
// can set the served annotation of a only: the same write on pod b, and a
// cluster admin's write on a, are refused with the reason; other changes of
// b (a label) still go through.
func TestServedReportOnlyByThePodItself(t *testing.T) {
	const (
		release = "served"
		ns      = "ac-served"
		app     = "consumers-served"
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rel := render(t, release, ns, nil)
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		o := rel.Find(kind, "", "served-autoconfig-served-report")
		if o == nil {
			t.Fatalf("the chart renders no %s; got %v", kind, rel.Kinds())
		}
		must(t, k8s.Create(ctx, o.DeepCopy()))
		// The policy is cluster-wide: it must not judge the pod writes
		// of the tests that run after this one.
		t.Cleanup(func() {
			if err := k8s.Delete(context.Background(), o.DeepCopy()); err != nil {
				t.Errorf("delete %s: %v", kind, err)
			}
		})
	}

	must(t, k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: app}}))
	sidecarAccount(ctx, t, app, "openresty")
	pods := map[string]*corev1.Pod{}
	for _, name := range []string{"openresty-a", "openresty-b"} {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: app, Name: name},
			Spec: corev1.PodSpec{ServiceAccountName: "openresty", Containers: []corev1.Container{
				{Name: "openresty", Image: "openresty/openresty"}, {Name: "reload", Image: "autoconfig-reload"},
			}},
		}
		must(t, k8s.Create(ctx, p))
		pods[name] = p
	}

	// The token the kubelet would mount into pod a: bound to it.
	admin, err := kubernetes.NewForConfig(testCfg)
	must(t, err)
	asPodA := asPod(ctx, t, pods["openresty-a"])
	report := served.Report{At: time.Now().UTC().Truncate(time.Second), How: served.HowReload, Keys: map[string]string{"session_route_m.conf": served.ID([]byte("x"))}}
	annotate := func(c kubernetes.Interface, pod string) error {
		v, err := report.Marshal()
		must(t, err)
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{served.Annotation: v}}})
		_, err = c.CoreV1().Pods(app).Patch(ctx, pod, types.MergePatchType, b, metav1.PatchOptions{})
		return err
	}

	// The policy takes effect asynchronously: wait until it refuses an
	// admin's pod created with a report (a pod of its own, so no write
	// lands on a or b before the policy is in force).
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		v, _ := report.Marshal()
		probe := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: app, Name: "probe", Annotations: map[string]string{served.Annotation: v}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		}
		if err := k8s.Create(ctx, probe); err != nil {
			return apierrors.IsForbidden(err), nil
		}
		return false, k8s.Delete(ctx, probe)
	}); err != nil {
		t.Fatalf("the policy never took effect: %v", err)
	}
	forged := annotate(asPodA, "openresty-b")
	if !apierrors.IsForbidden(forged) || !strings.Contains(forged.Error(), "only pod "+app+"/openresty-b itself") || !strings.Contains(forged.Error(), "bound to pod openresty-a") {
		t.Fatalf("pod a writing pod b's report: %v, want Forbidden naming both pods", forged)
	}
	if err := annotate(admin, "openresty-a"); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "no pod-bound token") {
		t.Fatalf("an admin writing pod a's report: %v, want Forbidden", err)
	}

	// The sidecar's reporter, with pod a's token, on pod a: accepted.
	rep := &reload.PodReporter{Client: asPodA, Namespace: app, Name: "openresty-a"}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rep.Run(rctx) }()
	rep.Report(report)
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		p, err := admin.CoreV1().Pods(app).Get(ctx, "openresty-a", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got, err := served.Parse(p.Annotations[served.Annotation])
		return err == nil && got.Keys["session_route_m.conf"] == report.Keys["session_route_m.conf"] && got.How == served.HowReload, nil
	}); err != nil {
		t.Fatalf("the reporter's write on its own pod did not land: %v", err)
	}
	rcancel()
	must(t, <-done)

	// Other changes of another pod are not the policy's business.
	_, err = asPodA.CoreV1().Pods(app).Patch(ctx, "openresty-b", types.MergePatchType, []byte(`{"metadata":{"labels":{"routing.modelsphere.dev/master":"false"}}}`), metav1.PatchOptions{})
	must(t, err)
	b, err := admin.CoreV1().Pods(app).Get(ctx, "openresty-b", metav1.GetOptions{})
	must(t, err)
	if _, ok := b.Annotations[served.Annotation]; ok {
		t.Fatalf("pod b has a served annotation it never wrote: %v", b.Annotations)
	}
}

// sidecarAccount creates the consumers' ServiceAccount name in ns with the
// rights their sidecars have on pods (get, list, patch: the reload
// sidecar's served report on its own pod, hagate's labels on others).
func sidecarAccount(ctx context.Context, t *testing.T, ns, name string) {
	t.Helper()
	must(t, k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}))
	must(t, k8s.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-sidecars"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "patch"}}},
	}))
	must(t, k8s.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-sidecars"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name + "-sidecars"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: name}},
	}))
}

// asPod is a client authenticated as the pod's ServiceAccount with the
// token the kubelet would mount into it: bound to the pod (name and UID),
// which is what the chart's served-report policy requires. p must have
// been created (its UID set).
func asPod(ctx context.Context, t *testing.T, p *corev1.Pod) kubernetes.Interface {
	t.Helper()
	admin, err := kubernetes.NewForConfig(testCfg)
	must(t, err)
	tr, err := admin.CoreV1().ServiceAccounts(p.Namespace).CreateToken(ctx, p.Spec.ServiceAccountName, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
	}}, metav1.CreateOptions{})
	must(t, err)
	cfg := rest.AnonymousClientConfig(testCfg)
	cfg.BearerToken = tr.Status.Token
	c, err := kubernetes.NewForConfig(cfg)
	must(t, err)
	return c
}
