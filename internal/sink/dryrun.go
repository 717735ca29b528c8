package sink

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
)

// DryRun says what a Writer would do, and writes nothing: it reads each
// ConfigMap fresh through Reader (a live API reader, not a cache) and
// makes the Writer's decision on it (decide: grant, the guard per key,
// render, the size limit), returning the Outcome the write would have:
// Written means "would write" (Changes lists the keys), and Unchanged,
// Missing, NotPermitted, RenderFailed, TooLarge and Forbidden (the read
// refused) are what the Writer would report. Blocked and Sums are as the
// Writer fills them. What only the write itself can show (Rejected, a
// patch refused by RBAC, a concurrent change) is not foreseen.
type DryRun struct {
	Reader client.Reader
	// Trusted are route namespaces that may write any ConfigMap (Granted).
	Trusted []string
}

// Apply is Writer.Apply without the write.
func (d DryRun) Apply(ctx context.Context, routeNS string, outputs []compiler.Output, guard Guard) ([]Outcome, error) {
	return d.ApplyRecorded(ctx, routeNS, outputs, guard, nil)
}

// ApplyRecorded is Writer.ApplyRecorded without the write; record is
// called with the Sums decided, as the Writer calls it.
func (d DryRun) ApplyRecorded(ctx context.Context, routeNS string, outputs []compiler.Output, guard Guard, record func(cm string, sums map[string]Sum)) ([]Outcome, error) {
	return d.run(ctx, applyRequests(routeNS, outputs, guard, record))
}

// Remove is Writer.Remove without the write.
func (d DryRun) Remove(ctx context.Context, routeNS string, keys map[string][]string, guard Guard) ([]Outcome, error) {
	return d.run(ctx, removeRequests(routeNS, keys, guard))
}

// Check is Writer.Check on a fresh read.
func (d DryRun) Check(ctx context.Context, routeNS string, keys map[string][]string, guard Guard) ([]Outcome, error) {
	return d.run(ctx, checkRequests(routeNS, keys, guard))
}

// run decides each request on a fresh read of its ConfigMap.
func (d DryRun) run(ctx context.Context, reqs []*request) ([]Outcome, error) {
	results := make([]result, len(reqs))
	for i, req := range reqs {
		key, err := objectKey(req.ref)
		if err != nil {
			results[i] = result{retry: err}
			continue
		}
		cm := &corev1.ConfigMap{}
		err = d.Reader.Get(ctx, key, cm)
		results[i] = decideRead(key, cm, err, d.Trusted, req)
	}
	return outcomes(reqs, results)
}
