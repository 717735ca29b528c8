package charttest

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/modelsphere/autoconfig/internal/controller"
	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/schema"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TestHelmUninstallDeletesRoutesFirst installs the chart with a route
// under modelRoutes through Helm's own SDK (action.Install) on the real API
// server, runs the controller under the chart's ServiceAccount until the
// route's key is written, then uninstalls (action.Uninstall). The
// pre-delete hook Job must delete the route and wait while the controller
// still runs: afterwards no route is left terminating and its key is gone
// from the ConfigMap.
//
// envtest has no kubelet and no Job controller, so this test plays both
// for the hook Job alone: it runs the Job's own container args with the
// real autoconfig binary, authenticated as the Job's ServiceAccount
// (impersonation, so the hook's RBAC is what is tested), and records the
// outcome in the Job's status, which is what Helm waits on.
func TestHelmUninstallDeletesRoutesFirst(t *testing.T) {
	const (
		release = "life"
		ns      = "ac-life"
		routes  = "life-routes"
	)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "autoconfig")
	if out, err := exec.Command("go", "build", "-C", root, "-o", bin, "./cmd/autoconfig").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, n := range []string{ns, routes} {
		must(t, k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}))
	}
	createConsumerAndBackend(ctx, t, routes, routes, "10.1.0.9")

	// Helm talks to the API server as an administrator, as a user would.
	kubeconfig := userKubeconfig(t, "helm-admin", []string{"system:masters"}, "")
	cfg := new(action.Configuration)
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &kubeconfig
	nsFlag := ns
	flags.Namespace = &nsFlag
	must(t, cfg.Init(flags, ns, "secret", t.Logf))
	chrt, err := loader.Load(Path(root))
	must(t, err)
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace = release, ns
	install.Timeout = time.Minute
	values := map[string]any{"modelRoutes": []any{map[string]any{
		"name": "wan", "namespace": routes,
		"spec": map[string]any{
			"modelType": "video",
			"discovery": map[string]any{"service": "wan"},
			"nginx": map[string]any{
				"outputConfigMap": "openresty-conf",
				"peers":           []any{map[string]any{"use": "backend", "priority": 2}},
			},
		},
	}}}
	if _, err := install.RunWithContext(ctx, chrt, values); err != nil {
		t.Fatalf("helm install: %v", err)
	}

	// The controller, under the chart's ServiceAccount.
	sch := routeScheme(t)
	admin := admin(t)
	ccfg := rest.CopyConfig(testCfg)
	ccfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + release + "-autoconfig",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	mgr, err := ctrl.NewManager(ccfg, ctrl.Options{
		Scheme: sch, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Cache: controller.CacheOptions(nil),
		// TestReconcileAsServiceAccount runs one in this process too.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	must(t, err)
	v, err := schema.Default()
	must(t, err)
	r := &controller.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Validator: v, Recorder: mgr.GetEventRecorder(controller.Name)}
	mctx, stop := context.WithCancel(ctx)
	defer stop()
	must(t, r.SetupWithManager(mctx, mgr, 2))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()

	key := client.ObjectKey{Namespace: routes, Name: "openresty-conf"}
	testbin.WaitCtx(t, ctx, 100*time.Millisecond, "the route's key written", func() bool {
		var cm corev1.ConfigMap
		return admin.Get(ctx, key, &cm) == nil && strings.Contains(cm.Data["session_route_wan.conf"], "10.1.0.9:8000")
	})

	// The controller dies with its Deployment, as its pods would: from
	// then on nobody removes a route's finalizer.
	go func() {
		for mctx.Err() == nil {
			var d appsv1.Deployment
			err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: release + "-autoconfig"}, &d)
			if apierrors.IsNotFound(err) || (err == nil && !d.DeletionTimestamp.IsZero()) {
				t.Log("the controller Deployment is being deleted: stopping the controller")
				stop()
				return
			}
			time.Sleep(20 * time.Millisecond) // polling the API server
		}
	}()

	// The hook Job's "kubelet".
	jobs := make(chan error, 1)
	go func() { jobs <- runHookJob(ctx, t, admin, ns, release+"-autoconfig-route-cleanup", bin) }()

	uninstall := action.NewUninstall(cfg)
	uninstall.Timeout = 2 * time.Minute
	if _, err := uninstall.Run(release); err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	if err := <-jobs; err != nil {
		t.Fatalf("hook job: %v", err)
	}
	var left v1alpha1.ModelRouteList
	must(t, admin.List(ctx, &left, client.InNamespace(routes)))
	if len(left.Items) != 0 {
		t.Errorf("routes left after helm uninstall: %s (deletionTimestamp %v, finalizers %v)", left.Items[0].Name, left.Items[0].DeletionTimestamp, left.Items[0].Finalizers)
	}
	var cm corev1.ConfigMap
	must(t, admin.Get(ctx, key, &cm))
	if _, ok := cm.Data["session_route_wan.conf"]; ok {
		t.Error("the route's key is still in the ConfigMap after helm uninstall")
	}
	var dep appsv1.Deployment
	if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: release + "-autoconfig"}, &dep); !apierrors.IsNotFound(err) {
		t.Errorf("the controller Deployment is still there after uninstall: %v", err)
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("manager: %v", err)
	}
}

// runHookJob waits for the Job, runs its container's args with bin as the
// Job's ServiceAccount, and records Complete or Failed in its status.
func runHookJob(ctx context.Context, t *testing.T, c client.Client, ns, name, bin string) error {
	var job batchv1.Job
	for {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &job)
		if err == nil {
			break
		}
		if !apierrors.IsNotFound(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no hook Job %s/%s: %w", ns, name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	spec := job.Spec.Template.Spec
	kc := userKubeconfig(t, "hook-"+name, nil, "system:serviceaccount:"+ns+":"+spec.ServiceAccountName)
	args := append(append([]string{}, spec.Containers[0].Args...), "--kubeconfig="+kc)
	out, runErr := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	t.Logf("hook job %s ran: autoconfig %s\n%s", name, strings.Join(args, " "), out)
	now := metav1.Now()
	job.Status.StartTime = &now
	cond := batchv1.JobCondition{Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now}
	if runErr == nil {
		job.Status.CompletionTime = &now
		job.Status.Succeeded = 1
		job.Status.Conditions = []batchv1.JobCondition{withType(cond, batchv1.JobSuccessCriteriaMet, "CompletionsReached"), withType(cond, batchv1.JobComplete, "CompletionsReached")}
	} else {
		job.Status.Failed = 1
		job.Status.Conditions = []batchv1.JobCondition{withType(cond, batchv1.JobFailureTarget, "BackoffLimitExceeded"), withType(cond, batchv1.JobFailed, "BackoffLimitExceeded")}
	}
	if err := c.Status().Update(ctx, &job); err != nil {
		return fmt.Errorf("record the Job's outcome: %w", err)
	}
	if runErr != nil {
		return fmt.Errorf("autoconfig %s: %w", strings.Join(args, " "), runErr)
	}
	return nil
}

func withType(c batchv1.JobCondition, typ batchv1.JobConditionType, reason string) batchv1.JobCondition {
	c.Type, c.Reason = typ, reason
	return c
}

// userKubeconfig writes a kubeconfig of a new envtest user (in groups),
// impersonating as when set.
func userKubeconfig(t *testing.T, name string, groups []string, as string) string {
	t.Helper()
	if as != "" {
		groups = append(groups, "system:masters") // may impersonate
	}
	u, err := testEnv.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	must(t, err)
	b, err := u.KubeConfig()
	must(t, err)
	kc, err := clientcmd.Load(b)
	must(t, err)
	if as != "" {
		for _, ai := range kc.AuthInfos {
			ai.Impersonate = as
			ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:authenticated"}
		}
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	must(t, clientcmd.WriteToFile(*kc, path))
	return path
}
