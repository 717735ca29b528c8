package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Keys the sample routes own.
const (
	videoKey   = "session_route_wan-video.conf"
	llmKey     = "session_route_qwen.conf"
	cartKey    = "config.yaml"
	monitorKey = "Qwen_Qwen2.5-72B-Instruct.monitor.conf"
)

func (d *demo) scenes(ctx context.Context) error {
	d.title("scene 1: routes applied, no backend is ready yet")
	d.say("an empty backend list is never written: the routes wait and say so")
	if err := d.waitFor(ctx, "routes report NoBackends", func() (bool, error) {
		rows, err := d.routes(ctx)
		if err != nil {
			return false, err
		}
		n := 0
		for _, r := range rows {
			if r.reason == "NoBackends" {
				n++
			}
		}
		return n == 2, nil
	}); err != nil {
		return err
	}
	if err := d.table(ctx); err != nil {
		return err
	}
	d.pause(ctx)

	for _, s := range []struct {
		title      string
		llm, video int
	}{
		{"scene 2: first backends come up (qwen ×2, wan ×2)", 2, 2},
		{"scene 3: scale out (qwen ×4, wan ×4)", 4, 4},
		{"scene 4: scale in (qwen ×1, wan ×1)", 1, 1},
	} {
		if err := d.scale(ctx, s.title, s.llm, s.video); err != nil {
			return err
		}
		d.pause(ctx)
		if s.llm == 4 && d.nginx != nil {
			if err := d.failover(ctx); err != nil {
				return err
			}
			d.pause(ctx)
		}
	}
	if err := d.canary(ctx); err != nil {
		return err
	}
	d.pause(ctx)
	if err := d.engine(ctx); err != nil {
		return err
	}
	d.pause(ctx)
	if err := d.wake(ctx); err != nil {
		return err
	}
	d.pause(ctx)
	if c := d.o.Converged; c != nil {
		urls := map[string]string{"autoconfig": "http://" + d.ctrlMetrics + "/metrics"}
		if d.reloadMetrics != "" {
			urls["reload"] = "http://" + d.reloadMetrics + "/metrics"
		}
		if err := c(urls); err != nil {
			return err
		}
	}
	if err := d.scaleToZero(ctx); err != nil {
		return err
	}
	d.pause(ctx)
	if err := d.deleteRoutes(ctx); err != nil {
		return err
	}
	d.metrics(ctx)
	return nil
}

// llmEndpoints are the EndpointSlice entries of the running vLLM
// stand-ins, spread over the two GPU nodes (the monitor output's gpu type).
func llmEndpoints(bs []*backend) []endpoint {
	var eps []endpoint
	for i, b := range bs {
		e := b.endpoint()
		e.node = "gpu-a"
		if i%2 == 1 {
			e.node = "gpu-b"
		}
		eps = append(eps, e)
	}
	return eps
}

// scale sets the backends of both models, waits until the controller has
// written them (and nginx serves them), and shows what changed.
func (d *demo) scale(ctx context.Context, title string, llmN, videoN int) error {
	d.title(title)
	var removed []*backend
	for len(d.llm) < llmN {
		b, err := d.startBackend(llmName(d.nextLLM()))
		if err != nil {
			return err
		}
		d.llm = append(d.llm, b)
	}
	if len(d.llm) > llmN {
		removed = append(removed, d.llm[llmN:]...)
		d.llm = d.llm[:llmN]
	}
	for len(d.video) < videoN {
		b, err := d.startBackend(videoName(d.nextVideo()))
		if err != nil {
			return err
		}
		d.video = append(d.video, b)
	}
	if len(d.video) > videoN {
		removed = append(removed, d.video[videoN:]...)
		d.video = d.video[:videoN]
	}
	var veps []endpoint
	for _, b := range d.video {
		veps = append(veps, b.endpoint())
	}
	leps := llmEndpoints(d.llm)
	d.say("EndpointSlices: llm/qwen → %s, video/wan → %s", strings.Join(describe(d.llm), ", "), strings.Join(describe(d.video), ", "))
	start := time.Now()
	if err := d.setEndpoints(ctx, llmBackendNS, "qwen", "http", leps); err != nil {
		return err
	}
	if err := d.setEndpoints(ctx, videoNS, "wan", "http", veps); err != nil {
		return err
	}
	if err := d.waitFor(ctx, fmt.Sprintf("routes converge on %d/%d backends", llmN, videoN), func() (bool, error) {
		return d.converged(ctx, leps, veps)
	}); err != nil {
		return err
	}
	d.say("controller wrote every output in %s", time.Since(start).Round(10*time.Millisecond))
	if err := d.table(ctx); err != nil {
		return err
	}
	if err := d.showOutputs(ctx); err != nil {
		return err
	}
	if d.nginx != nil {
		want := backendNames(d.video)
		n := 2*len(want) + 2
		var got []string
		if err := d.waitFor(ctx, "nginx serves the video route from "+strings.Join(want, ", "), func() (bool, error) {
			served, failed := d.videoRound(ctx, n)
			got = served
			return failed == 0 && slices.Equal(served, want), nil
		}); err != nil {
			return err
		}
		d.say("nginx (reloaded by the reload sidecar): %d × GET /%s/v2/video_generation/tasks → served by %s (since the scale: %s)",
			n, videoRoute, strings.Join(got, ", "), time.Since(start).Round(10*time.Millisecond))
		want = backendNames(d.llm)
		n = 2*len(want) + 2
		if err := d.waitFor(ctx, "nginx serves the llm route from "+strings.Join(want, ", "), func() (bool, error) {
			served, failed := d.llmRound(ctx, n)
			got = served
			return failed == 0 && slices.Equal(served, want), nil
		}); err != nil {
			return err
		}
		d.say("nginx + lua router: %d × POST /%s/%s → llm requests served by %s (since the scale: %s)",
			n, llmRoute, llmPath, strings.Join(got, ", "), time.Since(start).Round(10*time.Millisecond))
	}
	for _, b := range removed {
		b.close()
	}
	if len(removed) > 0 {
		d.say("stopped %s (their pods are gone)", strings.Join(backendNames(removed), ", "))
	}
	return nil
}

var videoCounter, llmCounter int

func (d *demo) nextVideo() int { videoCounter++; return videoCounter }
func (d *demo) nextLLM() int   { llmCounter++; return llmCounter }

func describe(bs []*backend) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.name+"@"+b.addr.String())
	}
	if len(out) == 0 {
		return []string{"none"}
	}
	return out
}

// converged: both routes Ready with the expected backend counts, and the
// ConfigMaps hold exactly those endpoints.
func (d *demo) converged(ctx context.Context, llm, video []endpoint) (bool, error) {
	for _, w := range []struct {
		name string
		n    int
	}{{llmRoute, len(llm)}, {videoRoute, len(video)}} {
		r, ok, err := d.route(ctx, w.name)
		if err != nil || !ok {
			return false, err
		}
		if r.ready != "True" || r.backendsN != int64(w.n) {
			return false, nil
		}
		// With the nginx data plane, the llm route (spec.nginx.service
		// llm-route/openresty) converged when nginx serves its file.
		if w.name == llmRoute && d.nginx != nil && r.synced != "1/1" {
			return false, nil
		}
	}
	cm, err := d.configMap(ctx, routeNS, nginxCM)
	if err != nil {
		return false, err
	}
	if !holdsExactly(cm.Data[videoKey], upstreamServer, video, "server %s:%d ") {
		return false, nil
	}
	cart, err := d.configMap(ctx, routeNS, cartCM)
	if err != nil {
		return false, err
	}
	return holdsExactly(cart.Data[cartKey], cartWorker, llm, "http://%s:%d"), nil
}

// holdsExactly: the selected lines (primary servers only) are one per
// endpoint, each naming it.
func holdsExactly(content string, keep func(string) bool, eps []endpoint, format string) bool {
	var lines []string
	for _, l := range pick(content, keep) {
		if !strings.Contains(l, " backup") {
			lines = append(lines, l)
		}
	}
	if len(lines) != len(eps) {
		return false
	}
	for _, e := range eps {
		needle := fmt.Sprintf(format, e.ip, e.port)
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, needle) }) {
			return false
		}
	}
	return true
}

// showOutputs prints what changed in each rendered output since the last
// scene.
func (d *demo) showOutputs(ctx context.Context) error {
	ng, err := d.configMap(ctx, routeNS, nginxCM)
	if err != nil {
		return err
	}
	cart, err := d.configMap(ctx, routeNS, cartCM)
	if err != nil {
		return err
	}
	mon, err := d.configMap(ctx, monitorNS, monitorCM)
	if err != nil {
		return err
	}
	d.showChange(routeNS+"/"+nginxCM+" "+videoKey+" (upstream)", ng.Data[videoKey], upstreamServer)
	d.showChange(routeNS+"/"+nginxCM+" "+llmKey+" (peers)", ng.Data[llmKey], backendPeer)
	d.showChange(routeNS+"/"+cartCM+" "+cartKey+" (workers)", cart.Data[cartKey], cartWorker)
	d.showChange(monitorNS+"/"+monitorCM+" "+monitorKey, mon.Data[monitorKey], monitorLine)
	return nil
}

// scaleToZero shows that an empty discovery result is never written.
func (d *demo) scaleToZero(ctx context.Context) error {
	d.title("scene 5: every video backend goes NotReady (a bad rollout, a discovery blip)")
	before, err := d.configMap(ctx, routeNS, nginxCM)
	if err != nil {
		return err
	}
	if err := d.setEndpoints(ctx, videoNS, "wan", "http", nil); err != nil {
		return err
	}
	if err := d.waitFor(ctx, "video route reports NoBackends", func() (bool, error) {
		r, _, err := d.route(ctx, videoRoute)
		return r.reason == "NoBackends", err
	}); err != nil {
		return err
	}
	after, err := d.configMap(ctx, routeNS, nginxCM)
	if err != nil {
		return err
	}
	if after.Data[videoKey] != before.Data[videoKey] {
		return fmt.Errorf("the video route file changed after its backends went away: an empty list must never be written")
	}
	if err := d.table(ctx); err != nil {
		return err
	}
	d.say("%s is unchanged: the last good backend list stays (an empty one would drop all traffic)", videoKey)
	return nil
}

// deleteRoutes deletes both routes; the finalizer removes their keys.
func (d *demo) deleteRoutes(ctx context.Context) error {
	d.title("scene 6: delete the routes (the finalizer removes exactly their keys)")
	for _, name := range []string{llmRoute, videoRoute} {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(modelRouteGVK)
		u.SetNamespace(routeNS)
		u.SetName(name)
		if err := d.c.Delete(ctx, u); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	if err := d.waitFor(ctx, "routes gone", func() (bool, error) {
		for _, name := range []string{llmRoute, videoRoute} {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(modelRouteGVK)
			err := d.c.Get(ctx, client.ObjectKey{Namespace: routeNS, Name: name}, u)
			if err == nil {
				return false, nil
			}
			if !apierrors.IsNotFound(err) {
				return false, err
			}
		}
		return true, nil
	}); err != nil {
		return err
	}
	for _, ref := range [][2]string{{routeNS, nginxCM}, {monitorNS, monitorCM}, {routeNS, cartCM}} {
		cm, err := d.configMap(ctx, ref[0], ref[1])
		if err != nil {
			return err
		}
		keys := make([]string, 0, len(cm.Data))
		for k := range cm.Data {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if ref[1] != cartCM && len(keys) > 0 {
			return fmt.Errorf("ConfigMap %s/%s still holds %v after the routes were deleted", ref[0], ref[1], keys)
		}
		note := ""
		if ref[1] == cartCM {
			note = " (the CART chart's own ConfigMap: left as it is)"
		}
		d.say("ConfigMap %s/%s keys: %v%s", ref[0], ref[1], keys, note)
	}
	return nil
}

// metrics prints the controller's own counters.
func (d *demo) metrics(ctx context.Context) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.ctrlMetrics+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.say("metrics: %v", err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	d.step("controller metrics (http://" + d.ctrlMetrics + "/metrics, autoconfig_*)")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "autoconfig_") {
			d.say("%s", l)
		}
	}
}
