package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"golang.org/x/sync/errgroup"

	"github.com/modelsphere/autoconfig/internal/testenv"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// Names and constants of the generated cluster.
const (
	// cmNamespace holds the shared openresty ConfigMaps (the openresty
	// chart's namespace); they grant every route namespace.
	cmNamespace = "openresty"
	// baseKey is the consumer's own key in every ConfigMap; the
	// controller must leave it alone.
	baseKey = "nginx-base.conf"
	// backendPort is every model server's port.
	backendPort = 8000
	// allowedNamespacesAnnotation grants routes of other namespaces writes
	// into a ConfigMap (spelled out as a consumer chart would).
	allowedNamespacesAnnotation = "routing.modelsphere.dev/allowed-route-namespaces"
	// gpuProductLabel is the node label discovery reads the GPU type from.
	gpuProductLabel = "nvidia.com/gpu.product"
	// serviceCIDR replaces envtest's /24, too small for 1000 Services.
	serviceCIDR = "10.96.0.0/16"
	// leaseNamespace holds the controllers' leader-election Lease
	// (the chart's release namespace) in a -takeover run.
	leaseNamespace = "autoconfig"
	// maxPods is the number of distinct pod IPs per generation
	// (10.64.0.0/12 before the rollout, 10.80.0.0/12 after).
	maxPods = 16 * 256 * 254
)

// layout places every object of a run deterministically.
type layout struct {
	routes, cms, pods, nodes, nss, sliceSize, rolloutPct int
	modelType                                            string
	// selRoutes routes (the first ones: round robin over the namespaces
	// and the ConfigMaps) discover their pods by label selector and have
	// no Service or EndpointSlice; the others by Service.
	selRoutes int
}

// selector reports whether route r discovers its pods by selector.
func (l layout) selector(r int) bool { return r < l.selRoutes }

// selectorOf is route r's pod label selector: its pods' labels.
func (l layout) selectorOf(r int) string {
	return "app.kubernetes.io/name=vllm,app.kubernetes.io/instance=" + l.routeName(r)
}

// selectorNamespaces are the namespaces holding selector routes (where
// the controller caches pods).
func (l layout) selectorNamespaces() []string {
	var out []string
	for r := 0; r < min(l.selRoutes, l.nss); r++ {
		out = append(out, l.routeNS(r))
	}
	return out
}

func (l layout) routeName(r int) string { return fmt.Sprintf("model-%04d", r) }
func (l layout) routeNS(r int) string   { return fmt.Sprintf("scale-%02d", r%l.nss) }
func (l layout) cmName(c int) string    { return fmt.Sprintf("openresty-routes-%03d", c) }
func (l layout) cmOf(r int) int         { return r % l.cms }
func (l layout) nodeName(n int) string  { return fmt.Sprintf("gpu-node-%03d", n) }
func (l layout) routeKey(r int) string  { return "session_route_" + l.routeName(r) + ".conf" }

// podRange is route r's pods: [start, end) of the global pod index; the
// pods are split as evenly as possible.
func (l layout) podRange(r int) (start, end int) {
	base, rem := l.pods/l.routes, l.pods%l.routes
	start = r*base + min(r, rem)
	end = start + base
	if r < rem {
		end++
	}
	return start, end
}

// routeOf is the route of global pod i.
func (l layout) routeOf(i int) int {
	base, rem := l.pods/l.routes, l.pods%l.routes
	if i < rem*(base+1) {
		return i / (base + 1)
	}
	return rem + (i-rem*(base+1))/base
}

// hash is the fake pod-template-hash of route r.
func (l layout) hash(r int) string {
	s := sha256.Sum256([]byte(l.routeName(r)))
	return hex.EncodeToString(s[:])[:10]
}

func (l layout) podName(i int) string {
	r := l.routeOf(i)
	s := sha256.Sum256([]byte(fmt.Sprint("pod", i)))
	return l.routeName(r) + "-" + l.hash(r) + "-" + hex.EncodeToString(s[:])[:5]
}

// podIP is pod i's address in generation gen (0 before the rollout, 1
// after): 10.64.0.0/12 and 10.80.0.0/12, never .0 or .255, away from
// the Service range.
func podIP(gen, i int) string {
	return fmt.Sprintf("10.%d.%d.%d", 64+16*gen+i/(256*254), (i/254)%256, i%254+1)
}

func nodeIP(n int) string { return fmt.Sprintf("192.168.%d.%d", n/250, n%250+2) }

// changed reports whether the rollout changes the IP of the j-th pod of a
// route: rolloutPct of every route's pods, spread over its slices.
func (l layout) changed(j int) bool {
	return (j+1)*l.rolloutPct/100 > j*l.rolloutPct/100
}

// uid is a stable fake UID for objects nobody creates (ReplicaSets).
func uid(s string) types.UID {
	h := sha256.Sum256([]byte(s))
	x := hex.EncodeToString(h[:16])
	return types.UID(x[:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32])
}

// cluster is one run's control plane and the benchmark's clients.
type cluster struct {
	env        *envtest.Environment
	cfg        *rest.Config
	kubeconfig string
	cs         kubernetes.Interface // protobuf
	csJSON     kubernetes.Interface // JSON (raw watch, metrics)
	c          client.Client        // ModelRoutes
	own        *requestCounter
}

// requestCounter counts the benchmark's own requests, to tell them from
// the controller's in the API server's request totals.
type requestCounter struct {
	all, writes atomic.Int64
}

type countingTransport struct {
	rt http.RoundTripper
	n  *requestCounter
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.n.all.Add(1)
	if r.Method != http.MethodGet {
		t.n.writes.Add(1)
	}
	return t.rt.RoundTrip(r)
}

func (b *bench) startCluster(dir string) (*cluster, error) {
	env := &envtest.Environment{
		BinaryAssetsDirectory: b.assets,
		CRDDirectoryPaths:     []string{b.crds},
		ErrorIfCRDPathMissing: true,
	}
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", serviceCIDR)
	env.ControlPlane.Etcd = &envtest.Etcd{}
	if !b.o.EtcdFsync {
		env.ControlPlane.Etcd.Configure().Set("unsafe-no-fsync", "true")
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start control plane (binaries in %s): %w", b.assets, err)
	}
	cl := &cluster{env: env, cfg: cfg, own: &requestCounter{}}
	cl.kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := writeFile(cl.kubeconfig, env.KubeConfig); err != nil {
		cl.stop()
		return nil, err
	}
	mk := func(contentType string) *rest.Config {
		c := rest.CopyConfig(cfg)
		c.QPS, c.Burst = float32(b.o.QPS), b.o.Burst
		c.ContentType = contentType
		c.Timeout = time.Minute
		c.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, cl.own} })
		return c
	}
	pb := mk("application/vnd.kubernetes.protobuf")
	if cl.cs, err = kubernetes.NewForConfig(pb); err == nil {
		js := mk("application/json")
		js.Timeout = 0 // the raw watch is long-lived
		if cl.csJSON, err = kubernetes.NewForConfig(js); err == nil {
			s := k8sruntime.NewScheme()
			if err = clientgoscheme.AddToScheme(s); err == nil {
				if err = v1alpha1.AddToScheme(s); err == nil {
					cl.c, err = client.New(mk("application/json"), client.Options{Scheme: s})
				}
			}
		}
	}
	if err != nil {
		cl.stop()
		return nil, err
	}
	return cl, nil
}

func (cl *cluster) stop() error { return cl.env.Stop() }

// setupTimes says how long each part of the cluster took to create.
type setupTimes struct {
	ControlPlane float64 `json:"controlPlaneSeconds"`
	Nodes        float64 `json:"nodesSeconds"`
	Services     float64 `json:"servicesSeconds"`
	Pods         float64 `json:"podsSeconds"`
	Slices       float64 `json:"slicesSeconds"`
	Routes       float64 `json:"routesSeconds"`
	Total        float64 `json:"totalSeconds"`
	Objects      int     `json:"objects"`
	Requests     int64   `json:"requests"`
}

// world is what the run created and what the rollout changes.
type world struct {
	l layout
	// svcUID are the Services' UIDs (the slices' owner), by route.
	svcUID []types.UID
	// podUID are the pods' UIDs (the endpoints' targetRef).
	podUID []types.UID
	// gen is each pod's IP generation.
	gen []int
	// slices are the created EndpointSlices by route, kept for the
	// rollout's updates (resourceVersion included).
	slices [][]*discoveryv1.EndpointSlice
}

// parallel runs fn(0..n-1) on workers goroutines; the first error stops it.
func parallel(ctx context.Context, workers, n int, fn func(ctx context.Context, i int) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i := 0; i < n; i++ {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error { return fn(gctx, i) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err() // interrupted before every item started
}

// retry retries a request the API server refused for load.
func retry(ctx context.Context, what string, fn func() error) error {
	var err error
	for attempt := 0; attempt < 8; attempt++ {
		if err = fn(); err == nil {
			return nil
		}
		if !(apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
			apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || strings.Contains(err.Error(), "connection reset")) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(50<<attempt) * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// setup creates the cluster shape: namespaces, GPU nodes, the ConfigMaps,
// one Service and its EndpointSlices per route, the pods with a kubelet's
// status, and the routes.
func (b *bench) setup(ctx context.Context, cl *cluster, l layout, times *setupTimes) (*world, error) {
	w := &world{l: l, svcUID: make([]types.UID, l.routes), podUID: make([]types.UID, l.pods), gen: make([]int, l.pods), slices: make([][]*discoveryv1.EndpointSlice, l.routes)}
	start := time.Now()
	reqs0 := cl.own.all.Load()
	workers := b.o.Workers
	step := func(name string, t *float64, n int, fn func(ctx context.Context, i int) error) error {
		s := time.Now()
		if err := parallel(ctx, workers, n, fn); err != nil {
			return fmt.Errorf("create %s: %w", name, err)
		}
		*t = time.Since(s).Seconds()
		times.Objects += n
		b.logf("  %d %s in %.1fs", n, name, *t)
		return nil
	}

	nss := []string{cmNamespace}
	for i := 0; i < min(l.nss, l.routes); i++ {
		nss = append(nss, l.routeNS(i))
	}
	all := append(slices.Clone(nss), leaseNamespace)
	var nsT float64
	if err := step("namespaces", &nsT, len(all), func(ctx context.Context, i int) error {
		return retry(ctx, "namespace "+all[i], func() error {
			_, err := cl.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: all[i]}}, metav1.CreateOptions{})
			return err
		})
	}); err != nil {
		return nil, err
	}
	if err := step("nodes", &times.Nodes, l.nodes, func(ctx context.Context, n int) error {
		return b.createNode(ctx, cl, l, n)
	}); err != nil {
		return nil, err
	}
	var cmT float64
	if err := step("ConfigMaps", &cmT, l.cms, func(ctx context.Context, c int) error {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: cmNamespace, Name: l.cmName(c),
				Labels:      map[string]string{"app.kubernetes.io/name": "openresty", "app.kubernetes.io/component": "routes"},
				Annotations: map[string]string{allowedNamespacesAnnotation: strings.Join(nss[1:], ",")}},
			Data: map[string]string{baseKey: "# the openresty chart's own configuration; autoconfig leaves it alone\nmap_hash_bucket_size 128;\n"},
		}
		return retry(ctx, "configmap "+cm.Name, func() error {
			_, err := cl.cs.CoreV1().ConfigMaps(cmNamespace).Create(ctx, cm, metav1.CreateOptions{})
			return err
		})
	}); err != nil {
		return nil, err
	}
	times.Nodes += cmT + nsT
	// Selector routes (the first selRoutes) have no Service and no
	// EndpointSlices.
	svcRoutes := l.routes - l.selRoutes
	if err := step("Services", &times.Services, svcRoutes, func(ctx context.Context, i int) error {
		r := l.selRoutes + i
		return retry(ctx, "service "+l.routeName(r), func() error {
			s, err := cl.cs.CoreV1().Services(l.routeNS(r)).Create(ctx, service(l, r), metav1.CreateOptions{})
			if err == nil {
				w.svcUID[r] = s.UID
			}
			return err
		})
	}); err != nil {
		return nil, err
	}
	if err := step("pods (create + status)", &times.Pods, l.pods, func(ctx context.Context, i int) error {
		return b.createPod(ctx, cl, w, i)
	}); err != nil {
		return nil, err
	}
	if err := step("routes' EndpointSlice sets", &times.Slices, svcRoutes, func(ctx context.Context, i int) error {
		r := l.selRoutes + i
		for _, s := range w.desiredSlices(r) {
			err := retry(ctx, "endpointslice "+s.Name, func() error {
				got, err := cl.cs.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, s, metav1.CreateOptions{})
				if err == nil {
					w.slices[r] = append(w.slices[r], got)
				}
				return err
			})
			if err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if err := step("ModelRoutes", &times.Routes, l.routes, func(ctx context.Context, r int) error {
		rt := route(l, r)
		return retry(ctx, "modelroute "+rt.Name, func() error { return cl.c.Create(ctx, rt) })
	}); err != nil {
		return nil, err
	}
	times.Total = time.Since(start).Seconds()
	times.Requests = cl.own.all.Load() - reqs0
	return w, nil
}

func (b *bench) createNode(ctx context.Context, cl *cluster, l layout, n int) error {
	name := l.nodeName(n)
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"kubernetes.io/hostname":           name,
			"kubernetes.io/os":                 "linux",
			"kubernetes.io/arch":               "amd64",
			"node.kubernetes.io/instance-type": "gpu-8x-h100",
			"topology.kubernetes.io/zone":      fmt.Sprintf("zone-%c", 'a'+n%3),
			gpuProductLabel:                    "NVIDIA-H100-80GB-HBM3",
			"nvidia.com/gpu.count":             "8",
			"nvidia.com/gpu.memory":            "81559",
			"nvidia.com/gpu.present":           "true",
		}},
		Spec: corev1.NodeSpec{PodCIDR: fmt.Sprintf("10.%d.%d.0/24", 64+n/256, n%256)},
	}
	return retry(ctx, "node "+name, func() error {
		got, err := cl.cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			got, err = cl.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		}
		if err != nil {
			return err
		}
		now := metav1.Now()
		got.Status = corev1.NodeStatus{
			Capacity: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("192"), corev1.ResourceMemory: resource.MustParse("2Ti"),
				corev1.ResourcePods: resource.MustParse("110"), "nvidia.com/gpu": resource.MustParse("8"),
			},
			Allocatable: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("190"), corev1.ResourceMemory: resource.MustParse("1900Gi"),
				corev1.ResourcePods: resource.MustParse("110"), "nvidia.com/gpu": resource.MustParse("8"),
			},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				Message: "kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP(n)}, {Type: corev1.NodeHostName, Address: name}},
			NodeInfo: corev1.NodeSystemInfo{KubeletVersion: testenv.KubeVersion, ContainerRuntimeVersion: "containerd://2.1.4",
				OperatingSystem: "linux", Architecture: "amd64", OSImage: "Ubuntu 24.04.2 LTS", KernelVersion: "6.8.0-71-generic"},
		}
		_, err = cl.cs.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{})
		return err
	})
}

func service(l layout, r int) *corev1.Service {
	name := l.routeName(r)
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: l.routeNS(r), Name: name, Labels: map[string]string{"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name}},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: map[string]string{"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name},
			Ports:    []corev1.ServicePort{{Name: "http", Port: backendPort, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}},
		},
	}
}

// pod is route r's i-th pod as a Deployment would create it (the status
// is set afterwards, as the kubelet would).
func pod(l layout, i int) *corev1.Pod {
	r := l.routeOf(i)
	name := l.routeName(r)
	rs := name + "-" + l.hash(r)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: l.routeNS(r), Name: l.podName(i),
			Labels: map[string]string{
				"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name,
				"app.kubernetes.io/component": "model-server", "pod-template-hash": l.hash(r),
			},
			Annotations: map[string]string{"kubectl.kubernetes.io/default-container": "vllm"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs, UID: uid(rs),
				Controller: ptr(true), BlockOwnerDeletion: ptr(true)}},
		},
		Spec: corev1.PodSpec{
			NodeName:           l.nodeName(i % l.nodes),
			ServiceAccountName: "default",
			Containers: []corev1.Container{{
				Name:  "vllm",
				Image: "vllm/vllm-openai:v0.11.0",
				Args:  []string{"--model", "Qwen/Qwen2.5-72B-Instruct", "--port", "8000", "--tensor-parallel-size", "1", "--max-model-len", "32768", "--gpu-memory-utilization", "0.92"},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: backendPort, Protocol: corev1.ProtocolTCP}},
				Env: []corev1.EnvVar{
					{Name: "HF_HOME", Value: "/models/cache"},
					{Name: "VLLM_LOGGING_LEVEL", Value: "INFO"},
					{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
				},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("64Gi"), "nvidia.com/gpu": resource.MustParse("1")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Gi"), "nvidia.com/gpu": resource.MustParse("1")},
				},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromString("http")}}, PeriodSeconds: 5},
				LivenessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromString("http")}}, PeriodSeconds: 10, FailureThreshold: 6},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "shm", MountPath: "/dev/shm"},
					{Name: "models", MountPath: "/models", ReadOnly: true},
					{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "shm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: ptr(resource.MustParse("16Gi"))}}},
				{Name: "models", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/mnt/models"}}},
				{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr(int64(3607))}},
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
					{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
				}}}},
			},
			Tolerations: []corev1.Toleration{
				{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
				{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))},
				{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))},
			},
			NodeSelector: map[string]string{gpuProductLabel: "NVIDIA-H100-80GB-HBM3"},
		},
	}
}

// createPod creates pod i and sets the status a kubelet reports for a
// running, ready pod.
func (b *bench) createPod(ctx context.Context, cl *cluster, w *world, i int) error {
	l := w.l
	p := pod(l, i)
	var got *corev1.Pod
	err := retry(ctx, "pod "+p.Name, func() error {
		var err error
		got, err = cl.cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			got, err = cl.cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		}
		return err
	})
	if err != nil {
		return err
	}
	w.podUID[i] = got.UID
	n := i % l.nodes
	started := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	ip := podIP(0, i)
	got.Status.Phase = corev1.PodRunning
	got.Status.HostIP, got.Status.HostIPs = nodeIP(n), []corev1.HostIP{{IP: nodeIP(n)}}
	got.Status.PodIP, got.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	got.Status.StartTime = &started
	got.Status.Conditions = nil
	for _, t := range []corev1.PodConditionType{"PodReadyToStartContainers", corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled} {
		got.Status.Conditions = append(got.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: started})
	}
	sum := sha256.Sum256([]byte(p.Name))
	got.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name:         "vllm",
		State:        corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}},
		Ready:        true,
		Started:      ptr(true),
		RestartCount: 0,
		Image:        "docker.io/vllm/vllm-openai:v0.11.0",
		ImageID:      "docker.io/vllm/vllm-openai@sha256:" + imageDigest,
		ContainerID:  "containerd://" + hex.EncodeToString(sum[:]),
	}}
	return retry(ctx, "pod status "+p.Name, func() error {
		_, err := cl.cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{})
		return err
	})
}

// desiredSlices are route r's EndpointSlices for the pods' current IPs:
// the route's pods in order, at most sliceSize per slice, as the
// EndpointSlice controller packs them.
func (w *world) desiredSlices(r int) []*discoveryv1.EndpointSlice {
	l := w.l
	start, end := l.podRange(r)
	name := l.routeName(r)
	var out []*discoveryv1.EndpointSlice
	for s, k := 0, start; k < end; s, k = s+1, k+l.sliceSize {
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: l.routeNS(r), Name: fmt.Sprintf("%s-%s", name, sliceSuffix(r, s)),
				Labels: map[string]string{
					discoveryv1.LabelServiceName: name,
					discoveryv1.LabelManagedBy:   "endpointslice-controller.k8s.io",
					"app.kubernetes.io/name":     "vllm", "app.kubernetes.io/instance": name,
				},
				Annotations:     map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": time.Now().UTC().Format(time.RFC3339)},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name, UID: w.svcUID[r], Controller: ptr(true), BlockOwnerDeletion: ptr(true)}},
			},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(backendPort)), Protocol: ptr(corev1.ProtocolTCP)}},
		}
		for i := k; i < min(k+l.sliceSize, end); i++ {
			n := i % l.nodes
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{podIP(w.gen[i], i)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: l.routeNS(r), Name: l.podName(i), UID: w.podUID[i]},
				NodeName:   ptr(l.nodeName(n)),
				Zone:       ptr(fmt.Sprintf("zone-%c", 'a'+n%3)),
			})
		}
		out = append(out, slice)
	}
	return out
}

// sliceSuffix is a stable 5-character suffix, as generateName gives.
func sliceSuffix(r, s int) string {
	h := sha256.Sum256([]byte(fmt.Sprint("slice", r, "-", s)))
	const alphabet = "bcdfghjklmnpqrstvwxz2456789"
	var b [5]byte
	for i := range b {
		b[i] = alphabet[int(h[i])%len(alphabet)]
	}
	return string(b[:])
}

// route is a minimal ModelRoute for route r: service discovery (selector
// discovery for the selector routes), the backend pod-IP tier only, no
// cart and no monitor.
func route(l layout, r int) *v1alpha1.ModelRoute {
	d := v1alpha1.Discovery{Service: l.routeName(r)}
	if l.selector(r) {
		d = v1alpha1.Discovery{Selector: l.selectorOf(r)}
	}
	return &v1alpha1.ModelRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: l.routeNS(r), Name: l.routeName(r)},
		Spec: v1alpha1.Spec{
			ModelType: l.modelType,
			Discovery: d,
			Nginx: v1alpha1.Nginx{
				OutputConfigMap: cmNamespace + "/" + l.cmName(l.cmOf(r)),
				Peers:           []v1alpha1.Peer{{Use: v1alpha1.UseBackend, Priority: 2}},
			},
		},
	}
}

// imageDigest is the fake digest of the model server image.
var imageDigest = func() string {
	s := sha256.Sum256([]byte("vllm/vllm-openai:v0.11.0"))
	return hex.EncodeToString(s[:])
}()

func ptr[T any](v T) *T { return &v }
