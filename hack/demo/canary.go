package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The canary scene: a second model version (qwen-v2, its own Service)
// takes 10 % of the llm route's sessions; every session stays on the
// version it started on.
const (
	canaryService = "qwen-v2"
	canaryWeight  = 10
	// canarySessions × canaryTurns requests, each with its session's key.
	canarySessions = 200
	canaryTurns    = 3
)

// canary runs the scene: start the canary's backends, give the route a
// canary at canaryWeight percent, send sessions through nginx and show how
// they split and that none moved; then remove the canary again.
func (d *demo) canary(ctx context.Context) error {
	d.title(fmt.Sprintf("scene: canary %s at %d %% with sticky sessions", canaryService, canaryWeight))
	var v2 []*backend
	for i := 0; i < 2; i++ {
		b, err := d.startBackend(canaryService + "-" + strconv.Itoa(i))
		if err != nil {
			return err
		}
		v2 = append(v2, b)
	}
	defer func() {
		for _, b := range v2 {
			b.close()
		}
	}()
	if err := d.c.Create(ctx, granted(headless(service(llmBackendNS, canaryService, "http", 8000)))); err != nil {
		return fmt.Errorf("create Service %s: %w", canaryService, err)
	}
	if err := d.setEndpoints(ctx, llmBackendNS, canaryService, "http", llmEndpoints(v2)); err != nil {
		return err
	}
	d.say("Service llm/%s → %s", canaryService, strings.Join(describe(v2), ", "))
	patch := fmt.Sprintf(`{"spec":{"canary":{"discovery":{"service":"%s/%s"},"weight":%d}}}`, llmBackendNS, canaryService, canaryWeight)
	d.step("kubectl patch mr qwen --type merge -p '" + patch + "'")
	if err := d.patchRoute(ctx, patch); err != nil {
		return err
	}
	if err := d.waitFor(ctx, "route qwen reports its canary backends and nginx serves it", func() (bool, error) {
		n, current, err := d.canaryStatus(ctx)
		if err != nil || !current || n != int64(len(v2)) {
			return false, err
		}
		if d.nginx == nil {
			return true, nil
		}
		row, ok, err := d.route(ctx, llmRoute)
		return ok && row.synced == "1/1", err
	}); err != nil {
		return err
	}
	if err := d.table(ctx); err != nil {
		return err
	}
	if d.nginx != nil {
		res, err := d.canarySessions(ctx)
		if err != nil {
			return err
		}
		d.say("%d sessions × %d turns (header x-session-id) through nginx: %d sessions on the canary (%s), %d on stable; %d sessions changed version; %d requests failed",
			canarySessions, canaryTurns, res.canary, strings.Join(backendNames(v2), ", "), res.stable, res.flips, res.failed)
		if res.flips > 0 || res.failed > 0 {
			return fmt.Errorf("canary: %d sessions changed version, %d requests failed", res.flips, res.failed)
		}
	}
	d.step("kubectl patch mr qwen --type merge -p '{\"spec\":{\"canary\":null}}'  # roll back: one version again")
	if err := d.patchRoute(ctx, `{"spec":{"canary":null}}`); err != nil {
		return err
	}
	return d.waitFor(ctx, "route qwen has one version again", func() (bool, error) {
		n, current, err := d.canaryStatus(ctx)
		return current && n == 0, err
	})
}

// canaryStatus reads the llm route's status.canaryBackends and whether the
// status is of the route's current generation.
func (d *demo) canaryStatus(ctx context.Context) (n int64, current bool, err error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(modelRouteGVK)
	if err := d.c.Get(ctx, client.ObjectKey{Namespace: routeNS, Name: llmRoute}, u); err != nil {
		return 0, false, err
	}
	n, _, _ = unstructured.NestedInt64(u.Object, "status", "canaryBackends")
	gen, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
	return n, gen == u.GetGeneration(), nil
}

func (d *demo) patchRoute(ctx context.Context, patch string) error {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(modelRouteGVK)
	u.SetNamespace(routeNS)
	u.SetName(llmRoute)
	if err := d.c.Patch(ctx, u, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		return fmt.Errorf("patch route %s: %w", llmRoute, err)
	}
	return nil
}

type canaryResult struct{ canary, stable, flips, failed int }

// canarySessions sends canaryTurns chat completions for each of
// canarySessions sessions and counts the version (X-Model-Version) each
// session got, and the sessions whose turns got different versions.
func (d *demo) canarySessions(ctx context.Context) (canaryResult, error) {
	var res canaryResult
	c := http.Client{Timeout: 5 * time.Second}
	for s := 0; s < canarySessions; s++ {
		first := ""
		flipped := false
		for turn := 0; turn < canaryTurns; turn++ {
			body := `{"model":"` + llmModel + `","messages":[{"role":"user","content":"turn ` + strconv.Itoa(turn) + `"}],"max_tokens":8}`
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.nginx.URL(llmRoute)+llmPath, strings.NewReader(body))
			if err != nil {
				return res, err
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Session-Id", "demo-session-"+strconv.Itoa(s))
			resp, err := c.Do(req)
			if err != nil {
				res.failed++
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				res.failed++
				continue
			}
			v := resp.Header.Get("X-Model-Version")
			if v == "" {
				res.failed++
				continue
			}
			if first == "" {
				first = v
			} else if v != first {
				flipped = true
			}
		}
		if flipped {
			res.flips++
		}
		switch first {
		case "canary":
			res.canary++
		case "stable":
			res.stable++
		}
	}
	return res, nil
}
