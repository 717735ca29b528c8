package main

// End-to-end tests: the real hagate binary against a real kube-apiserver
// and etcd (envtest, no CRDs, started once for the package). There is no
// kubelet: the test plays it (pod deletion via a finalizer, SIGTERM/SIGKILL
// to the hagate process, restarting it). The app port is a TCP listener
// owned by the test. hagate runs as a user bound to the Role in
// docs/hagate.md, so the documented RBAC is what the tests exercise.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/modelsphere/autoconfig/internal/testbin"
	"github.com/modelsphere/autoconfig/internal/testenv"
)

const (
	routerName = "router"
	labelKey   = routerName + "-active"
	leaseName  = routerName + "-ha"
	// The "kubelet" finalizer lets a test hold a deleted pod in the
	// terminating state (deletionTimestamp set) as long as it likes.
	kubeletFinalizer = "hagate.test/kubelet"
	// tamperAnnotation marks a label the test added by hand, so the
	// invariant checker does not blame hagate for it.
	tamperAnnotation = "hagate.test/tamper"
	hagateUser       = "hagate"
)

// Short lease settings keep the package fast; they satisfy every rule
// hagate validates.
var leaseArgs = []string{"--lease-duration=2s", "--renew-deadline=1.5s", "--retry-period=0.3s", "--interval=0.3s"}

var (
	hagateBin      string
	adminCS        kubernetes.Interface
	hagateKubecfg  string
	testEnvStarted bool
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "hagate-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)

	// Under -race the binary is race-built too, so the end-to-end tests
	// check the gate's goroutines (elector, label loop).
	if hagateBin, err = testbin.Build(tmp, "hagate"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	// The shared helper resolves the binaries (failing, never skipping,
	// when they are missing); hagate needs no CRDs, so none are installed.
	assets, err := testenv.AssetsDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting envtest:", err)
		return 1
	}
	defer env.Stop()
	cfg.QPS, cfg.Burst = 200, 400
	adminCS = kubernetes.NewForConfigOrDie(cfg)

	user, err := env.AddUser(envtest.User{Name: hagateUser}, &rest.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "envtest user:", err)
		return 1
	}
	kc, err := user.KubeConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "envtest kubeconfig:", err)
		return 1
	}
	hagateKubecfg = filepath.Join(tmp, "kubeconfig")
	if err := os.WriteFile(hagateKubecfg, kc, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	testEnvStarted = true
	return m.Run()
}

// ---- cluster: one namespace per test ----

type cluster struct {
	t  testing.TB
	ns string
	w  *podWatcher

	mu       sync.Mutex
	replicas []*replica
}

func newCluster(t testing.TB) *cluster {
	t.Helper()
	if !testEnvStarted {
		t.Fatal("envtest not started")
	}
	ns := fmt.Sprintf("hagate-%d", rand.Uint32())
	ctx := context.Background()
	if _, err := adminCS.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	applyDocsRBAC(t, ns)
	c := &cluster{t: t, ns: ns}
	c.w = startWatcher(t, ns)
	t.Cleanup(func() {
		c.mu.Lock()
		rs := c.replicas
		c.mu.Unlock()
		for _, r := range rs {
			r.kill()
			if strings.Contains(r.logs(), "WARNING: DATA RACE") {
				t.Errorf("hagate for %s reported a data race", r.pod)
			}
		}
		if t.Failed() {
			for _, r := range rs {
				t.Logf("---- hagate log %s (%d starts) ----\n%s", r.pod, r.gen, tail(r.logs(), 80))
			}
			t.Logf("---- label history ----\n%s", c.w.history())
		}
	})
	return c
}

// rbacDocRE extracts the RBAC manifests between the markers in the docs.
var rbacDocRE = regexp.MustCompile("(?s)<!-- rbac:begin -->\\s*```yaml\\n(.*?)```\\s*<!-- rbac:end -->")

// applyDocsRBAC creates the Role from docs/hagate.md in ns and binds it
// to the test's hagate user.
func applyDocsRBAC(t testing.TB, ns string) {
	t.Helper()
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "hagate.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := rbacDocRE.FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/hagate.md: no RBAC yaml block between <!-- rbac:begin --> and <!-- rbac:end -->")
	}
	var roles int
	for _, part := range strings.Split(string(m[1]), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(part), &meta); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		switch meta.Kind {
		case "Role":
			var r rbacv1.Role
			if err := yaml.UnmarshalStrict([]byte(part), &r); err != nil {
				t.Fatal(err)
			}
			r.Namespace = ns
			if _, err := adminCS.RbacV1().Roles(ns).Create(ctx, &r, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			rb := &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: r.Name, Namespace: ns},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: r.Name},
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: hagateUser}},
			}
			if _, err := adminCS.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			roles++
		case "RoleBinding", "ServiceAccount":
			// The test binds the Role to its own user instead.
		default:
			t.Fatalf("unexpected kind %q in the docs' RBAC block", meta.Kind)
		}
	}
	if roles != 1 {
		t.Fatalf("docs' RBAC block has %d Roles, want 1", roles)
	}
}

func (c *cluster) createPod(name string) {
	c.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:       name,
			Namespace:  c.ns,
			Labels:     map[string]string{"app": routerName},
			Finalizers: []string{kubeletFinalizer},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "router", Image: "router"}}},
	}
	if _, err := adminCS.CoreV1().Pods(c.ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// terminatePod is the first half of a graceful pod deletion: the pod gets
// a deletionTimestamp (the finalizer keeps it), as kubelet sees it before
// sending SIGTERM.
func (c *cluster) terminatePod(name string) {
	c.t.Helper()
	if err := adminCS.CoreV1().Pods(c.ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// finishPod removes the finalizer: the terminating pod disappears.
func (c *cluster) finishPod(name string) {
	c.t.Helper()
	patch := []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`)
	if _, err := adminCS.CoreV1().Pods(c.ns).Patch(context.Background(), name, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		c.t.Fatal(err)
	}
}

// setLabel adds (tampering: with a marker annotation) or removes the active
// label by hand, as an operator with kubectl would.
func (c *cluster) setLabel(name string, on bool, tamperID int) error {
	var patch string
	if on {
		patch = fmt.Sprintf(`{"metadata":{"labels":{%q:"true"},"annotations":{%q:"%d"}}}`, labelKey, tamperAnnotation, tamperID)
	} else {
		patch = fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, labelKey)
	}
	_, err := adminCS.CoreV1().Pods(c.ns).Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

func (c *cluster) leaseHolder() string {
	l, err := adminCS.CoordinationV1().Leases(c.ns).Get(context.Background(), leaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func (c *cluster) getLease() (*coordinationv1.Lease, error) {
	return adminCS.CoordinationV1().Leases(c.ns).Get(context.Background(), leaseName, metav1.GetOptions{})
}

// updateLease changes the Lease as an outside writer would. The running
// leader renews the Lease concurrently, so a read-modify-write can meet a
// conflict; it is retried on the latest version.
func (c *cluster) updateLease(t testing.TB, mutate func(*coordinationv1.Lease)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := c.getLease()
		if err != nil {
			return err
		}
		mutate(l)
		_, err = adminCS.CoordinationV1().Leases(c.ns).Update(context.Background(), l, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// ---- the app: a TCP listener the test opens and closes ----

// appPort is the router's port. Closed, it keeps the port bound by a
// socket that does not listen (connections are refused), so no other
// process on this busy machine can take the port over in between and
// make the "dead" app look alive.
type appPort struct {
	mu     sync.Mutex
	port   int
	ln     net.Listener
	holdFD int // bound, not listening; -1 when open
}

func newApp(t testing.TB) *appPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &appPort{port: ln.Addr().(*net.TCPAddr).Port, holdFD: -1}
	a.serve(ln)
	t.Cleanup(func() {
		a.close()
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.holdFD >= 0 {
			syscall.Close(a.holdFD)
			a.holdFD = -1
		}
	})
	return a
}

func (a *appPort) serve(ln net.Listener) {
	a.ln = ln
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

// close stops listening and holds the port.
func (a *appPort) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ln == nil {
		return
	}
	a.ln.Close()
	a.ln = nil
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: a.port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return
	}
	a.holdFD = fd
}

// open listens on the same port again (retrying while the kernel still
// holds it).
func (a *appPort) open(t testing.TB) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ln != nil {
		return
	}
	if a.holdFD >= 0 {
		syscall.Close(a.holdFD)
		a.holdFD = -1
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(a.port))
		if err == nil {
			a.serve(ln)
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("reopen app port %d: %v", a.port, err)
			return
		}
		time.Sleep(20 * time.Millisecond) // polling the kernel, not waiting for hagate
	}
}

// ---- a replica: one pod's hagate process ----

type replica struct {
	c    *cluster
	pod  string
	app  *appPort
	args []string
	gen  int

	mu     sync.Mutex
	cmd    *exec.Cmd
	buf    *testbin.SyncBuffer
	done   chan struct{}
	status error
}

// addReplica creates the pod and its app port and starts its hagate.
func (c *cluster) addReplica(pod string, extra ...string) *replica {
	c.t.Helper()
	r := c.newReplica(pod, newApp(c.t), extra...)
	r.start()
	return r
}

// newReplica creates the pod; the caller starts hagate.
func (c *cluster) newReplica(pod string, app *appPort, extra ...string) *replica {
	c.t.Helper()
	c.createPod(pod)
	r := &replica{c: c, pod: pod, app: app, args: extra}
	c.mu.Lock()
	c.replicas = append(c.replicas, r)
	c.mu.Unlock()
	return r
}

func (r *replica) start() {
	r.c.t.Helper()
	args := append([]string{
		"--name=" + routerName,
		"--namespace=" + r.c.ns,
		"--pod-name=" + r.pod,
		"--app-port=" + strconv.Itoa(r.app.port),
		"--kubeconfig=" + hagateKubecfg,
		"--metrics-addr=",
		"--health-addr=",
		"--log-level=debug",
	}, leaseArgs...)
	args = append(args, r.args...)
	cmd := exec.Command(hagateBin, args...)
	r.mu.Lock()
	if r.buf == nil {
		r.buf = &testbin.SyncBuffer{}
	}
	buf := r.buf
	r.mu.Unlock()
	fmt.Fprintf(buf, "==== start %d ====\n", r.gen+1)
	mark := len(buf.String())
	cmd.Stdout, cmd.Stderr = buf, buf
	if err := cmd.Start(); err != nil {
		r.c.t.Fatal(err)
	}
	done := make(chan struct{})
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.gen++
	r.mu.Unlock()
	go func() {
		err := cmd.Wait()
		r.mu.Lock()
		r.status = err
		r.mu.Unlock()
		close(done)
	}()
	// Like a container that has started: hagate is up and handles
	// signals before the test (kubelet) sends any.
	r.waitLog(r.c.t, mark, settle, `msg=starting`)
}

func (r *replica) logs() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.buf == nil {
		return ""
	}
	return r.buf.String()
}

func (r *replica) running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done == nil {
		return false
	}
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// signal sends sig and waits (with a deadline) for the process to exit.
func (r *replica) signal(sig syscall.Signal) error {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("hagate for %s did not exit within 15s of %v", r.pod, sig)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if sig == syscall.SIGTERM && r.status != nil {
		return fmt.Errorf("hagate for %s exited with %v after SIGTERM, want status 0", r.pod, r.status)
	}
	return nil
}

func (r *replica) kill() { _ = r.signal(syscall.SIGKILL) }

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ---- the watcher: a real watch on pods, recording every label change ----

type podState struct {
	Labeled     bool
	Terminating bool
	Tamper      string // tamperAnnotation value
	// ByHand: the label appeared in the same write that changed the
	// tamper annotation, i.e. the test added it, not hagate.
	ByHand bool
}

type labelEvent struct {
	At    time.Time
	Pod   string
	State podState
	Gone  bool
}

type podWatcher struct {
	mu         sync.Mutex
	pods       map[string]podState
	changed    chan struct{}
	events     []labelEvent
	violations []string

	start      time.Time
	gapFrom    time.Time // zero while some pod is active
	seenActive bool
	longestGap time.Duration
}

func startWatcher(t testing.TB, ns string) *podWatcher {
	t.Helper()
	w := &podWatcher{pods: map[string]podState{}, changed: make(chan struct{}), start: time.Now()}
	ctx, cancel := context.WithCancel(context.Background())
	list, err := adminCS.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rv := list.ResourceVersion
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for ctx.Err() == nil {
			wi, err := adminCS.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
			if err != nil {
				if ctx.Err() == nil {
					w.violate(fmt.Sprintf("watch failed: %v", err))
				}
				return
			}
			for ev := range wi.ResultChan() {
				if ev.Type == watch.Error {
					if ctx.Err() != nil {
						break
					}
					w.violate(fmt.Sprintf("watch error: %v", apierrors.FromObject(ev.Object)))
					continue
				}
				p, ok := ev.Object.(*corev1.Pod)
				if !ok {
					continue
				}
				rv = p.ResourceVersion
				w.observe(ev.Type, p)
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-stopped
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, v := range w.violations {
			t.Errorf("invariant violated: %s", v)
		}
	})
	return w
}

func (w *podWatcher) violate(msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.violations = append(w.violations, msg)
}

func (w *podWatcher) observe(typ watch.EventType, p *corev1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	prev, existed := w.pods[p.Name]
	var st podState
	gone := typ == watch.Deleted
	if gone {
		delete(w.pods, p.Name)
	} else {
		st = podState{
			Labeled:     p.Labels[labelKey] == "true",
			Terminating: p.DeletionTimestamp != nil,
			Tamper:      p.Annotations[tamperAnnotation],
		}
		switch {
		case !st.Labeled:
		case prev.Labeled && existed:
			st.ByHand = prev.ByHand
		default:
			st.ByHand = st.Tamper != "" && st.Tamper != prev.Tamper
		}
		w.pods[p.Name] = st
	}
	if gone || !existed || st.Labeled != prev.Labeled || st.Terminating != prev.Terminating {
		w.events = append(w.events, labelEvent{At: now, Pod: p.Name, State: st, Gone: gone})
	}
	// The invariant: at most one pod labelled by hagate that is not
	// terminating.
	var active, byHagate []string
	for name, s := range w.pods {
		if s.Labeled && !s.Terminating {
			active = append(active, name)
			if !s.ByHand {
				byHagate = append(byHagate, name)
			}
		}
	}
	if len(byHagate) > 1 {
		sort.Strings(byHagate)
		w.violations = append(w.violations, fmt.Sprintf("%s: pods %v active and not terminating (rv %s)",
			now.Sub(w.start).Round(time.Millisecond), byHagate, p.ResourceVersion))
	}
	if len(byHagate) == 0 {
		if w.gapFrom.IsZero() {
			w.gapFrom = now
		}
	} else {
		if w.seenActive && !w.gapFrom.IsZero() {
			w.longestGap = max(w.longestGap, now.Sub(w.gapFrom))
		}
		w.seenActive = true
		w.gapFrom = time.Time{}
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

// waitFor blocks until cond holds on the watched pods, failing the test
// at the deadline. It returns how long it waited.
func (w *podWatcher) waitFor(t testing.TB, timeout time.Duration, what string, cond func(map[string]podState) bool) time.Duration {
	t.Helper()
	d, err := w.await(timeout, cond)
	if err != nil {
		t.Fatalf("waiting %v for %s: %v; pods now: %v", timeout, what, err, w.snapshot())
	}
	return d
}

func (w *podWatcher) await(timeout time.Duration, cond func(map[string]podState) bool) (time.Duration, error) {
	start := time.Now()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		w.mu.Lock()
		ok := cond(w.pods)
		ch := w.changed
		w.mu.Unlock()
		if ok {
			return time.Since(start), nil
		}
		select {
		case <-ch:
		case <-timer.C:
			return time.Since(start), errors.New("deadline exceeded")
		}
	}
}

func (w *podWatcher) snapshot() map[string]podState {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]podState, len(w.pods))
	for k, v := range w.pods {
		out[k] = v
	}
	return out
}

func (w *podWatcher) history() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	for _, e := range w.events {
		fmt.Fprintf(&b, "%8s %-12s labeled=%v terminating=%v byHand=%v gone=%v\n",
			e.At.Sub(w.start).Round(time.Millisecond), e.Pod, e.State.Labeled, e.State.Terminating, e.State.ByHand, e.Gone)
	}
	return b.String()
}

func (w *podWatcher) eventCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.events)
}

// labelEvents returns the recorded label/termination events of pod.
func (w *podWatcher) labelEvents(pod string) []labelEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []labelEvent
	for _, e := range w.events {
		if e.Pod == pod {
			out = append(out, e)
		}
	}
	return out
}

func (w *podWatcher) gapStats() (longest time.Duration, violations int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	longest = w.longestGap
	if w.seenActive && !w.gapFrom.IsZero() {
		longest = max(longest, time.Since(w.gapFrom))
	}
	return longest, len(w.violations)
}

// ---- conditions ----

// activePods are the labelled, non-terminating pods.
func activePods(m map[string]podState) []string {
	var out []string
	for n, s := range m {
		if s.Labeled && !s.Terminating {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

func onlyActive(pod string) func(map[string]podState) bool {
	return func(m map[string]podState) bool {
		a := activePods(m)
		return len(a) == 1 && a[0] == pod
	}
}

func exactlyOneActive(among ...string) func(map[string]podState) bool {
	return func(m map[string]podState) bool {
		a := activePods(m)
		if len(a) != 1 {
			return false
		}
		for _, p := range among {
			if a[0] == p {
				return true
			}
		}
		return len(among) == 0
	}
}

func noneActive(m map[string]podState) bool { return len(activePods(m)) == 0 }

// theActive returns the one active pod (the caller waited for it).
func (c *cluster) theActive() string {
	c.t.Helper()
	a := activePods(c.w.snapshot())
	if len(a) != 1 {
		c.t.Fatalf("want exactly one active pod, have %v", a)
	}
	return a[0]
}

// logMark is the current length of r's log, for waitLog.
func (r *replica) logMark() int { return len(r.logs()) }

// waitLog waits until r's log after mark contains substr.
func (r *replica) waitLog(t testing.TB, mark int, timeout time.Duration, substr string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(r.logs()[mark:], substr) {
		if time.Now().After(deadline) {
			t.Fatalf("hagate for %s did not log %q within %v", r.pod, substr, timeout)
		}
		time.Sleep(20 * time.Millisecond) // polling a log buffer
	}
}
