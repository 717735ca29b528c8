package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/internal/nginxtest"
)

// engineStatus is the part of the reference engine's GET /<route>/_status
// (in-pod callers only; the demo's client is 127.0.0.1) the demo reads.
type engineStatus struct {
	Options map[string]any `json:"options"`
	State   []struct {
		Use   string `json:"use"`
		Peers []struct {
			Host      string `json:"host"`
			Port      int    `json:"port"`
			Fails     int    `json:"fails"`
			Ejected   bool   `json:"ejected"`
			Ejections int    `json:"ejections"`
		} `json:"peers"`
	} `json:"state"`
}

func (d *demo) engineStatus(ctx context.Context) (engineStatus, error) {
	var st engineStatus
	return st, nginxtest.GetJSON(ctx, d.nginx.URL(llmRoute)+"_status", &st)
}

// failover: the llm route is switched to failureMode FailOpen (the sample
// leaves it unset: one try per request), then one vLLM stand-in stops
// while its pod is still listed Ready. Requests keep succeeding on the
// others: the engine retries the refused connection on another peer and
// ejects the dead one.
func (d *demo) failover(ctx context.Context) error {
	d.title("scene 3b: an llm backend fails while still listed Ready (failover)")
	d.say("the sample leaves failureMode unset (one try per request); FailOpen retries a refused connection on another peer and ejects a failing peer")
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"failureMode":"FailOpen"}}`))
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(modelRouteGVK)
	u.SetNamespace(routeNS)
	u.SetName(llmRoute)
	// The workers serving before the reload: until they are gone, one of
	// them may still accept a new connection (nginx closes an old
	// worker's listeners only when it gets to its shutdown) and serve it
	// with the old file's single try (a rare failed request in CI).
	oldWorkers := d.nginx.WorkerPIDs()
	start := time.Now()
	if err := d.c.Patch(ctx, u, patch); err != nil {
		return fmt.Errorf("set failureMode on %s: %w", llmRoute, err)
	}
	d.say("$ kubectl -n %s patch mr %s --type merge -p '{\"spec\":{\"failureMode\":\"FailOpen\"}}'", routeNS, llmRoute)
	var st engineStatus
	if err := d.waitFor(ctx, "nginx runs the FailOpen route file", func() (bool, error) {
		var err error
		st, err = d.engineStatus(ctx)
		return err == nil && st.Options["failure_mode"] == "FailOpen", nil
	}); err != nil {
		return err
	}
	if err := d.nginx.WaitWorkersGone(ctx, oldWorkers); err != nil {
		return fmt.Errorf("the workers of the previous route file did not exit: %w", err)
	}
	var opts []string
	for _, k := range []string{"failure_mode", "retry_on", "max_tries", "eject_consecutive_connect_failures", "max_ejection_percent", "ejection_seconds"} {
		if v, ok := st.Options[k]; ok {
			opts = append(opts, fmt.Sprintf("%s=%v", k, v))
		}
	}
	var tiers []string
	for _, t := range st.State {
		tiers = append(tiers, fmt.Sprintf("%s ×%d", t.Use, len(t.Peers)))
	}
	d.say("route file rewritten and reloaded in %s; the engine registered %s; tiers: %s",
		time.Since(start).Round(10*time.Millisecond), strings.Join(opts, " "), strings.Join(tiers, ", "))

	victim := d.llm[1]
	victim.close()
	var others []*backend
	for _, b := range d.llm {
		if b != victim {
			others = append(others, b)
		}
	}
	want := backendNames(others)
	d.say("stopped %s@%s: its port refuses connections, its pod is still in the EndpointSlice (no rewrite, no reload)", victim.name, victim.addr)

	seen := map[string]bool{}
	sent, failed := 0, 0
	for round := 0; round < 4; round++ {
		served, f := d.llmRound(ctx, 12)
		sent += 12
		failed += f
		for _, s := range served {
			seen[s] = true
		}
		if len(seen) >= len(want) {
			break
		}
	}
	var got []string
	for s := range seen {
		got = append(got, s)
	}
	slices.Sort(got)
	if failed != 0 || !slices.Equal(got, want) {
		return fmt.Errorf("failover: %d of %d requests failed, served by %v, want 0 failures and %v", failed, sent, got, want)
	}
	d.say("%d × POST /%s/%s with %s refusing → llm requests served by %s, %d client failures",
		sent, llmRoute, llmPath, victim.name, strings.Join(got, ", "), failed)
	st, err := d.engineStatus(ctx)
	if err != nil {
		return err
	}
	for _, t := range st.State {
		for _, p := range t.Peers {
			if t.Use == "backend" && p.Port == victim.addr.Port {
				state := fmt.Sprintf("not ejected (%d consecutive connection failures)", p.Fails)
				if p.Ejected {
					state = fmt.Sprintf("ejected for %vs (ejections so far: %d)", st.Options["ejection_seconds"], p.Ejections)
				}
				d.say("engine (GET /%s/_status): %s peer %s:%d %s", llmRoute, t.Use, p.Host, p.Port, state)
			}
		}
	}
	return nil
}
