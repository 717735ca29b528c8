package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/modelsphere/autoconfig/internal/llmsim"
)

// Minimal disruption: session keys placed on the route's pods, then each
// pod in turn removed from the route (re-render and reload) and added
// back. Consistent hashing moves only the removed pod's keys, and they
// return when it does.

// placeWorkers is how many placement requests run at once: one (light
// load), so no pod is near the bounded load (affinity_min_load, default
// 6) and every key is on its own pod.
const placeWorkers = 1

// removal is what removing one pod did.
type removal struct {
	Pod string `json:"pod"`
	// Held is the keys the pod held before (its share of the ring).
	Held    int     `json:"held"`
	HeldPct float64 `json:"held_pct"`
	Moved   int     `json:"moved"`
	// MovedPct is the share of all keys whose pod changed.
	MovedPct float64 `json:"moved_pct"`
	// FromOthers are moved keys that were not on the removed pod.
	FromOthers int `json:"moved_from_other_pods"`
	// Returned are moved keys on their first pod again after the re-add;
	// Back all keys on their first pod after it.
	Returned int `json:"returned"`
	Back     int `json:"same_pod_after_re_add"`
}

// disruption is every removal of one pod.
type disruption struct {
	Keys int `json:"keys"`
	Pods int `json:"pods"`
	// Removals are each pod's removal, the first one the headline: the
	// pod in the middle of the list.
	Removals []removal `json:"removals"`
	// MeanMovedPct is the mean over the removals (each pod once: the
	// pods' shares add up to all keys, so it is 100/pods when only the
	// removed pod's keys move); Min and Max the extremes.
	MeanMovedPct float64 `json:"mean_moved_pct"`
	MinMovedPct  float64 `json:"min_moved_pct"`
	MaxMovedPct  float64 `json:"max_moved_pct"`
	// AllMovedOnRemoved: in every removal each moved key was on the
	// removed pod.
	AllMovedOnRemoved bool `json:"all_moved_were_on_removed_pod"`
	// ReturnedPct is the moved keys (all removals) back on their first
	// pod after the re-add.
	ReturnedPct float64 `json:"returned_pct"`
	Failed      int     `json:"failed"`
}

func runDisruption(g *rig, o *options) (*disruption, error) {
	// No base time to first token: the requests are one token each and
	// only their placement counts.
	cfg := sessionPods
	cfg.BaseTTFT = -1
	pods, err := llmsim.StartPods(o.SessionPods, cfg)
	if err != nil {
		return nil, err
	}
	defer pods.Close()
	route := llmRoute("sess-disrupt", nil, nil)
	if err := g.install(route, podEndpoints(pods)); err != nil {
		return nil, err
	}
	defer g.removeRoute(route)
	client := newClient(2 * placeWorkers)
	defer client.CloseIdleConnections()
	url := g.chatURL(route)
	d := &disruption{Keys: o.Keys, Pods: len(pods), AllMovedOnRemoved: true}

	// place sends one request per key and returns each key's pod.
	place := func() ([]string, error) {
		out := make([]string, o.Keys)
		var mu sync.Mutex
		var firstErr error
		jobs := make(chan int)
		var wg sync.WaitGroup
		for range placeWorkers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range jobs {
					req := llmsim.ChatRequest{
						Messages:  []llmsim.Message{{Role: "user", Content: "ping " + strconv.Itoa(i)}},
						MaxTokens: 1,
					}
					r := llmsim.Chat(context.Background(), client, url, req, http.Header{"X-Session-Id": {"key-" + strconv.Itoa(i)}})
					out[i] = r.Pod
					if r.Err != nil || r.Status != http.StatusOK || r.Pod == "" {
						mu.Lock()
						d.Failed++
						if firstErr == nil {
							firstErr = fmt.Errorf("key %d: status %d: %v", i, r.Status, r.Err)
						}
						mu.Unlock()
					}
				}
			}()
		}
		for i := range o.Keys {
			jobs <- i
		}
		close(jobs)
		wg.Wait()
		if d.Failed > 10 {
			return nil, fmt.Errorf("%d placement requests failed, the first: %w", d.Failed, firstErr)
		}
		return out, nil
	}

	before, err := place()
	if err != nil {
		return d, err
	}
	var returned, moved int
	// The headline removal first, then the others.
	order := append(llmsim.Pods{pods[len(pods)/2]}, pods[:len(pods)/2]...)
	order = append(order, pods[len(pods)/2+1:]...)
	for _, gone := range order {
		logf("sessions: %s leaves the route and comes back", gone.Name())
		var rest llmsim.Pods
		for _, p := range pods {
			if p != gone {
				rest = append(rest, p)
			}
		}
		if err := g.install(route, podEndpoints(rest)); err != nil {
			return d, err
		}
		during, err := place()
		if err != nil {
			return d, err
		}
		if err := g.install(route, podEndpoints(pods)); err != nil {
			return d, err
		}
		after, err := place()
		if err != nil {
			return d, err
		}
		rm := removal{Pod: gone.Name()}
		for i := range before {
			if before[i] == gone.Name() {
				rm.Held++
			}
			if during[i] != before[i] {
				rm.Moved++
				if before[i] != gone.Name() {
					rm.FromOthers++
				}
				if after[i] == before[i] {
					rm.Returned++
				}
			}
			if after[i] == before[i] {
				rm.Back++
			}
		}
		rm.HeldPct, rm.MovedPct = pct(rm.Held, d.Keys), pct(rm.Moved, d.Keys)
		d.AllMovedOnRemoved = d.AllMovedOnRemoved && rm.FromOthers == 0
		returned += rm.Returned
		moved += rm.Moved
		d.Removals = append(d.Removals, rm)
	}
	d.MinMovedPct = 100
	for _, rm := range d.Removals {
		d.MeanMovedPct += rm.MovedPct / float64(len(d.Removals))
		d.MinMovedPct = min(d.MinMovedPct, rm.MovedPct)
		d.MaxMovedPct = max(d.MaxMovedPct, rm.MovedPct)
	}
	d.ReturnedPct = pct(returned, moved)
	return d, nil
}
