// Command floor is the memory floor of the scale benchmark (hack/scale):
// a bare client-go informer caching every EndpointSlice of the cluster (no
// transform, default client settings) in a program that does nothing
// else. It waits for the cache to sync and prints its own VmRSS and VmHWM
// as one JSON line: the least memory any controller that watches the
// slices needs, in the same Go runtime and client library. With
// --pod-namespaces it also caches every pod of those namespaces (one bare
// pod informer each): the floor of a controller that also discovers pods
// by selector there.
//
//	go run ./hack/scale/floor --kubeconfig FILE [--pod-namespaces a,b]
//
// It is its own small program, not a subcommand of the benchmark, so the
// benchmark's code (envtest, the compiler) does not inflate the floor.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/modelsphere/autoconfig/hack/scale/procmem"
	"github.com/modelsphere/autoconfig/internal/kubeclient"
)

// Result is the floor's report, one JSON line on stdout.
type Result struct {
	RSSKiB      int64   `json:"vmRSSKiB"`
	AnonKiB     int64   `json:"rssAnonKiB"`
	FileKiB     int64   `json:"rssFileKiB"`
	HWMKiB      int64   `json:"vmHWMKiB"`
	Slices      int     `json:"endpointSlices"`
	Pods        int     `json:"pods,omitempty"`
	SyncSeconds float64 `json:"syncSeconds"`
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("floor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster (required)")
	settle := fs.Duration("settle", time.Second, "wait after the cache synced before reading the memory")
	timeout := fs.Duration("timeout", 2*time.Minute, "bound of the cache sync")
	podNS := fs.String("pod-namespaces", "", "also cache the pods of these namespaces (comma-separated)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *kubeconfig == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: floor --kubeconfig FILE [--pod-namespaces a,b] [--settle 1s] [--timeout 2m]")
		return 2
	}
	var nss []string
	if *podNS != "" {
		nss = strings.Split(*podNS, ",")
	}
	res, err := floor(*kubeconfig, nss, *settle, *timeout)
	if err == nil {
		err = json.NewEncoder(stdout).Encode(res)
	}
	if err != nil {
		fmt.Fprintln(stderr, "floor:", err)
		return 1
	}
	return 0
}

func floor(kubeconfig string, podNamespaces []string, settle, timeout time.Duration) (*Result, error) {
	cfg, err := kubeclient.Config(kubeconfig, "")
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	factory := informers.NewSharedInformerFactory(cs, 0)
	inf := factory.Discovery().V1().EndpointSlices().Informer()
	factory.Start(ctx.Done())
	var podFactories []informers.SharedInformerFactory
	var podInfs []cache.SharedIndexInformer
	for _, ns := range podNamespaces {
		f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
		podInfs = append(podInfs, f.Core().V1().Pods().Informer())
		f.Start(ctx.Done())
		podFactories = append(podFactories, f)
	}
	synced := []cache.InformerSynced{inf.HasSynced}
	for _, pi := range podInfs {
		synced = append(synced, pi.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil, fmt.Errorf("informers not synced within %s", timeout)
	}
	res := &Result{SyncSeconds: time.Since(start).Seconds(), Slices: len(inf.GetStore().ListKeys())}
	for _, pi := range podInfs {
		res.Pods += len(pi.GetStore().ListKeys())
	}
	time.Sleep(settle)
	if res.RSSKiB, res.HWMKiB, err = procmem.Read(os.Getpid()); err != nil {
		return nil, err
	}
	if res.AnonKiB, res.FileKiB, err = procmem.Split(os.Getpid()); err != nil {
		return nil, err
	}
	cancel()
	factory.Shutdown()
	for _, f := range podFactories {
		f.Shutdown()
	}
	return res, nil
}
