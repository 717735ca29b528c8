package sink

// This file: the decision, shared by the Writer and DryRun. A route's
// wish for one ConfigMap is a request; decide takes the requests of a
// round and the ConfigMap's content and says, per request, what the write
// comes to (grant, each key's guard, render, the size limit) and which
// keys the patch sets or deletes. The Writer then patches; DryRun stops
// there.

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
)

// request is one route's change of one ConfigMap.
type request struct {
	// ref is the ConfigMap, ns/name.
	ref string
	// keys are the route's keys in it (Outcome.Keys).
	keys    []string
	routeNS string
	change  changeFunc
	// done receives the Writer's result (submit makes it).
	done chan result
}

// changeFunc decides, for a ConfigMap's current content, what to change.
// An error (a failed render) leaves the ConfigMap alone for this request.
type changeFunc func(*corev1.ConfigMap) (change, error)

// change is what a changeFunc decided for one ConfigMap.
type change struct {
	// set: the keys to set (non-nil) or delete (nil).
	set map[string]*string
	// blocked: the keys the guard blocked.
	blocked []KeyError
	// sums: what each key that was not blocked holds after the write
	// (Apply's requests; Outcome.Sums).
	sums map[string]Sum
}

// result is what a request came to: the value an Outcome is made of.
type result struct {
	state State
	// err explains RenderFailed, TooLarge, Forbidden and Rejected.
	err     error
	blocked []KeyError
	// sums are set for Written and Unchanged (Apply's requests).
	sums map[string]Sum
	// changes are set for Written.
	changes []KeyChange
	// retry is an API failure worth a retry (the workqueue's): the
	// request has no state.
	retry error
}

// outcome is r as req's Outcome.
func (req *request) outcome(r result) Outcome {
	return Outcome{ConfigMap: req.ref, State: r.state, Keys: req.keys, Err: r.err, Blocked: r.blocked, Sums: r.sums, Changes: r.changes}
}

// outcomes pairs each request with its result: the Outcomes, in the
// order of reqs, and the retryable errors joined.
func outcomes(reqs []*request, results []result) ([]Outcome, error) {
	var res []Outcome
	var errs []error
	for i, req := range reqs {
		if r := results[i]; r.retry != nil {
			errs = append(errs, r.retry)
			continue
		}
		res = append(res, req.outcome(results[i]))
	}
	return res, errors.Join(errs...)
}

// applyRequests are Apply's requests: one per ConfigMap of outputs, in
// first-seen order. Each renders its outputs from the content, asks guard
// (nil = allow all) per key and calls record (when not nil) with the Sums
// it decided.
func applyRequests(routeNS string, outputs []compiler.Output, guard Guard, record func(cm string, sums map[string]Sum)) []*request {
	var reqs []*request
	byCM := map[string]*request{}
	outs := map[string][]compiler.Output{}
	for _, o := range outputs {
		req, ok := byCM[o.ConfigMap]
		if !ok {
			req = &request{ref: o.ConfigMap, routeNS: routeNS}
			byCM[o.ConfigMap] = req
			reqs = append(reqs, req)
		}
		req.keys = append(req.keys, o.Key)
		outs[o.ConfigMap] = append(outs[o.ConfigMap], o)
	}
	for _, req := range reqs {
		req.change = renderChange(req.ref, outs[req.ref], guard, record)
	}
	return reqs
}

// renderChange is the change of Apply's request for ConfigMap ref.
func renderChange(ref string, outs []compiler.Output, guard Guard, record func(cm string, sums map[string]Sum)) changeFunc {
	return func(c *corev1.ConfigMap) (change, error) {
		ch := change{set: map[string]*string{}, sums: map[string]Sum{}}
		for _, o := range outs {
			if guard != nil {
				if err := guard(c, o.Key); err != nil {
					ch.blocked = append(ch.blocked, KeyError{o.Key, err})
					continue
				}
			}
			cur, ok := c.Data[o.Key]
			var in []byte
			if ok {
				in = []byte(cur)
			}
			b, err := o.Render(in)
			if err != nil {
				return ch, fmt.Errorf("render %s: %w", o.Key, err)
			}
			ch.sums[o.Key] = sha256.Sum256(b)
			if !ok || !bytes.Equal(b, in) {
				s := string(b)
				ch.set[o.Key] = &s
			}
		}
		if record != nil {
			record(ref, ch.sums)
		}
		return ch, nil
	}
}

// removeRequests are Remove's requests, in ConfigMap order: each deletes
// the keys present that guard (nil = allow all) allows.
func removeRequests(routeNS string, keys map[string][]string, guard Guard) []*request {
	var reqs []*request
	for _, ref := range slices.Sorted(maps.Keys(keys)) {
		ks := keys[ref]
		reqs = append(reqs, &request{ref: ref, keys: ks, routeNS: routeNS, change: func(c *corev1.ConfigMap) (change, error) {
			ch := change{set: map[string]*string{}}
			for _, k := range ks {
				if _, ok := c.Data[k]; !ok {
					continue
				}
				if guard != nil {
					if err := guard(c, k); err != nil {
						ch.blocked = append(ch.blocked, KeyError{k, err})
						continue
					}
				}
				ch.set[k] = nil
			}
			return ch, nil
		}})
	}
	return reqs
}

// checkRequests are Check's requests, in ConfigMap order: each changes
// nothing and reports the keys guard (nil = allow all) blocks.
func checkRequests(routeNS string, keys map[string][]string, guard Guard) []*request {
	var reqs []*request
	for _, ref := range slices.Sorted(maps.Keys(keys)) {
		ks := keys[ref]
		reqs = append(reqs, &request{ref: ref, keys: ks, routeNS: routeNS, change: func(c *corev1.ConfigMap) (change, error) {
			var ch change
			if guard != nil {
				for _, k := range ks {
					if err := guard(c, k); err != nil {
						ch.blocked = append(ch.blocked, KeyError{k, err})
					}
				}
			}
			return ch, nil
		}})
	}
	return reqs
}

// plan is one round's decision on a ConfigMap's content.
type plan struct {
	// res has a result for every request decided in this round; those
	// in in are Written once set is.
	res map[*request]result
	// in are the requests whose changes make up set.
	in []*request
	// rest are the requests that touch a key an earlier one of the round
	// took: they are decided in the next round, on the content this one
	// leaves (a second claimant of a new key sees the first one's mark).
	rest []*request
	// set: the keys the patch sets (non-nil) or deletes (nil).
	set map[string]*string
	// oversize: set, of several requests, takes the ConfigMap over
	// MaxSize. Each request is then decided and written on its own (a
	// single request's oversize write is TooLarge in res).
	oversize bool
}

// decide is the decision of one round: each request of batch, in turn, on
// the same content cm of key — whether its route may write cm (Granted),
// what its change sets (the guard per key, the render) — and whether the
// changes together fit under MaxSize.
func decide(key client.ObjectKey, cm *corev1.ConfigMap, trusted []string, batch []*request) plan {
	p := plan{res: map[*request]result{}, set: map[string]*string{}}
	for _, req := range batch {
		if !Granted(cm, req.routeNS, trusted) {
			p.res[req] = result{state: NotPermitted}
			continue
		}
		ch, err := req.change(cm)
		if err != nil {
			p.res[req] = result{state: RenderFailed, err: err, blocked: ch.blocked}
			continue
		}
		if slices.ContainsFunc(slices.Collect(maps.Keys(ch.set)), func(k string) bool { _, taken := p.set[k]; return taken }) {
			p.rest = append(p.rest, req)
			continue
		}
		r := result{state: Unchanged, blocked: ch.blocked, sums: ch.sums}
		if len(ch.set) > 0 {
			maps.Copy(p.set, ch.set)
			r.state, r.changes = Written, keyChanges(cm, ch.set)
			p.in = append(p.in, req)
		}
		p.res[req] = r
	}
	if size, grows := sizeAfter(cm, p.set); grows && size > MaxSize {
		if len(p.in) > 1 {
			p.oversize = true
			return p
		}
		req := p.in[0]
		p.res[req] = result{state: TooLarge, err: tooLarge(key, cm, p.set, size), blocked: p.res[req].blocked}
		p.in, p.set = nil, map[string]*string{}
	}
	return p
}

// decideRead is decide for one request on the outcome of reading key:
// the ConfigMap, or the read's error.
func decideRead(key client.ObjectKey, cm *corev1.ConfigMap, err error, trusted []string, req *request) result {
	if r, final := settled(err); final {
		return r
	}
	if err != nil {
		return result{retry: fmt.Errorf("get configmap %s: %w", key, err)}
	}
	return decide(key, cm, trusted, []*request{req}).res[req]
}

// settled maps an API error that ends a request, and every request of
// its batch: the ConfigMap is gone, or the controller may not use it.
func settled(err error) (result, bool) {
	switch {
	case apierrors.IsNotFound(err):
		return result{state: Missing}, true
	case apierrors.IsForbidden(err):
		return result{state: Forbidden, err: err}, true
	}
	return result{}, false
}

// keyChanges lists set, decided on cm, as KeyChanges sorted by key.
func keyChanges(cm *corev1.ConfigMap, set map[string]*string) []KeyChange {
	out := make([]KeyChange, 0, len(set))
	for _, k := range slices.Sorted(maps.Keys(set)) {
		c := KeyChange{Key: k}
		if v, ok := cm.Data[k]; ok {
			c.Live = &v
		}
		if v := set[k]; v != nil {
			w := *v
			c.Want = &w
		}
		out = append(out, c)
	}
	return out
}

// sizeAfter is the ConfigMap's size (as the API server counts it: the
// values of data and binaryData) after changed, and whether changed makes
// it larger (a removal or a shrinking write is always let through).
func sizeAfter(cm *corev1.ConfigMap, changed map[string]*string) (int, bool) {
	size := 0
	for _, v := range cm.Data {
		size += len(v)
	}
	for _, v := range cm.BinaryData {
		size += len(v)
	}
	before := size
	for k, v := range changed {
		size -= len(cm.Data[k])
		if v != nil {
			size += len(*v)
		}
	}
	return size, size > before
}

// tooLarge explains a write refused by size, in the user's terms.
func tooLarge(key client.ObjectKey, cm *corev1.ConfigMap, changed map[string]*string, size int) error {
	type kv struct {
		k string
		n int
	}
	var all []kv
	for k, v := range cm.Data {
		if _, ok := changed[k]; !ok {
			all = append(all, kv{k, len(v)})
		}
	}
	for k, v := range cm.BinaryData {
		all = append(all, kv{k, len(v)})
	}
	var mine []string
	for k, v := range changed {
		if v != nil {
			all = append(all, kv{k, len(*v)})
			mine = append(mine, fmt.Sprintf("%s (%s)", k, humanSize(len(*v))))
		}
	}
	slices.Sort(mine)
	slices.SortFunc(all, func(a, b kv) int {
		if a.n != b.n {
			return b.n - a.n
		}
		return strings.Compare(a.k, b.k)
	})
	var top []string
	for _, e := range all[:min(3, len(all))] {
		top = append(top, fmt.Sprintf("%s (%s)", e.k, humanSize(e.n)))
	}
	return fmt.Errorf("ConfigMap %s would be %s with %s, over the %s limit of the API server; the largest keys are %s: remove keys or move routes to another ConfigMap",
		key, humanSize(size), strings.Join(mine, ", "), humanSize(MaxSize), strings.Join(top, ", "))
}

// humanSize is n bytes as B, KiB or MiB (two decimals).
func humanSize(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
